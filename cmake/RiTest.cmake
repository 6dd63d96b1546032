# ri_add_test(NAME name SOURCES ... LIBS ... [LABELS ...] [TIMEOUT s] [ARGS ...])
# A test exits 77 when it cannot run on this machine; CTest shows it as skipped.
function(ri_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} PkgConfig::CMOCKA)
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  # A cmocka skip() without exit 77 would show as Passed: fail it instead
  # (exit 77 still shows as skipped: CTest checks SKIP_RETURN_CODE first).
  set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${T_TIMEOUT}
    LABELS "${T_LABELS}" FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    ENVIRONMENT "RI_BUILD_DIR=${CMAKE_BINARY_DIR};RI_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endfunction()

# ri_add_script_test(NAME name COMMAND ... [LABELS ...] [TIMEOUT s])
function(ri_add_script_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "COMMAND;LABELS" ${ARGN})
  add_test(NAME ${T_NAME} COMMAND ${T_COMMAND})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${T_TIMEOUT}
    LABELS "${T_LABELS}"
    ENVIRONMENT "RI_BUILD_DIR=${CMAKE_BINARY_DIR};RI_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endfunction()

# ri_add_mutant_test(NAME name TARGET test-executable EXPECT regex ARGS ...
#                    [LABELS ...] [TIMEOUT s])
# Runs an existing test with a deliberate fault turned on (through ARGS): it
# passes only when the test fails, and fails with output matching EXPECT.
function(ri_add_mutant_test)
  cmake_parse_arguments(T "" "NAME;TARGET;EXPECT;TIMEOUT" "ARGS;LABELS" ${ARGN})
  ri_add_script_test(NAME ${T_NAME} TIMEOUT ${T_TIMEOUT} LABELS ${T_LABELS}
    COMMAND sh ${CMAKE_SOURCE_DIR}/tests/common/expect_fail.sh "${T_EXPECT}"
            $<TARGET_FILE:${T_TARGET}> ${T_ARGS})
endfunction()
