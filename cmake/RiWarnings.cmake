# Warnings on everywhere; errors with RI_WERROR (CI); sanitizers with RI_SANITIZE.
add_compile_options(
  "$<$<COMPILE_LANGUAGE:C>:-Wall;-Wextra;-Wshadow;-Wpointer-arith;-Wstrict-prototypes;-Wmissing-prototypes;-Wno-unused-parameter>"
  "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wno-unused-parameter>")
if(RI_WERROR)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-Werror>")
endif()
if(RI_SANITIZE)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${RI_SANITIZE};-fno-sanitize-recover=all;-fno-omit-frame-pointer>")
  add_link_options("-fsanitize=${RI_SANITIZE}")
endif()
