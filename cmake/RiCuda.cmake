# CUDA is optional at build time.  AUTO turns it on when nvcc is found; the
# runtime is linked statically so binaries start on machines without a driver
# (cudaGetDeviceCount then fails with cudaErrorInsufficientDriver and we use
# the CPU path).
set(RI_HAVE_CUDA OFF)
if(NOT RI_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
    set(RI_HAVE_CUDA ON)
  elseif(RI_CUDA STREQUAL "ON")
    message(FATAL_ERROR "RI_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "RetroInfer CUDA backend: ${RI_HAVE_CUDA}")
