# Imports libtorch from the `torch` wheel as the target tessera::torch.
#
# TESSERA_PYTHON: the interpreter of the environment holding the wheel (required).
# TESSERA_CUDA:   link libtorch_cuda so that CUDA devices are usable (default: ON when the
#                 wheel has it and an NVIDIA driver is present; OFF keeps process start-up small).
set(TESSERA_PYTHON "" CACHE FILEPATH "python3 of the environment with the pinned torch wheel")
if(NOT TESSERA_PYTHON)
  message(FATAL_ERROR "tessera: set -DTESSERA_PYTHON=<venv>/bin/python (run scripts/install.sh, or use the Makefile)")
endif()
execute_process(
  COMMAND ${TESSERA_PYTHON} -c "import os,torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
  OUTPUT_VARIABLE _torch_info RESULT_VARIABLE _torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "tessera: ${TESSERA_PYTHON} cannot import torch; run scripts/install.sh")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 TORCH_ROOT)
list(GET _torch_info 1 TORCH_CXX11_ABI)
list(GET _torch_info 2 TORCH_VERSION_STRING)
message(STATUS "tessera: torch ${TORCH_VERSION_STRING} at ${TORCH_ROOT}")

set(_torch_lib ${TORCH_ROOT}/lib)
set(_cuda_default OFF)
if(EXISTS ${_torch_lib}/libtorch_cuda.so AND EXISTS /proc/driver/nvidia/version)
  set(_cuda_default ON)
endif()
option(TESSERA_CUDA "link libtorch_cuda (CUDA devices)" ${_cuda_default})

add_library(tessera_torch INTERFACE)
add_library(tessera::torch ALIAS tessera_torch)
target_include_directories(tessera_torch SYSTEM INTERFACE
  ${TORCH_ROOT}/include ${TORCH_ROOT}/include/torch/csrc/api/include)
target_compile_definitions(tessera_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
# c10d's ProcessGroupGloo.hpp includes Gloo's headers, which the wheel lacks: Debian's libgloo-dev
# puts them in /usr/include.
# libstdc++ first: the wheel's libtorch exports its own (older GCC) copies of std::filesystem
# functions, and whichever library the loader searches first wins. With libtorch first, our
# std::filesystem::remove_all ran libtorch's copy against this compiler's inline code and crashed.
set(_libs -Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state
    ${_torch_lib}/libtorch.so ${_torch_lib}/libtorch_cpu.so ${_torch_lib}/libc10.so)
set(_link_options "-Wl,-rpath,${_torch_lib}")
if(TESSERA_CUDA)
  # --no-as-needed: nothing references libtorch_cuda directly, but loading it registers the
  # CUDA backend with the dispatcher.
  list(APPEND _libs -Wl,--no-as-needed ${_torch_lib}/libtorch_cuda.so ${_torch_lib}/libc10_cuda.so -Wl,--as-needed)
  # c10d's NCCL backend (ProcessGroupNCCL, in libtorch_cuda) is declared under USE_C10D_NCCL; its
  # header includes nccl.h and the CUDA runtime headers, which the wheel's nvidia-* packages carry
  # (a CUDA toolkit is not needed). Their libraries (libcudart, libnccl, ...) are found at run time
  # through libtorch_cuda's own RPATH; at link time -rpath-link names the same folders.
  get_filename_component(_nvidia ${TORCH_ROOT}/../nvidia ABSOLUTE)
  find_path(TESSERA_CUDA_INCLUDE cuda_runtime_api.h NO_DEFAULT_PATH
            PATHS ${_nvidia}/cu13/include ${_nvidia}/cuda_runtime/include /usr/local/cuda/include)
  find_path(TESSERA_NCCL_INCLUDE nccl.h NO_DEFAULT_PATH PATHS ${_nvidia}/nccl/include /usr/include)
  if(NOT TESSERA_CUDA_INCLUDE OR NOT TESSERA_NCCL_INCLUDE)
    message(FATAL_ERROR "tessera: TESSERA_CUDA=ON needs cuda_runtime_api.h and nccl.h (looked in ${_nvidia}/*/include, "
                        "/usr/local/cuda/include, /usr/include): install the CUDA wheel of torch")
  endif()
  target_include_directories(tessera_torch SYSTEM INTERFACE ${TESSERA_CUDA_INCLUDE} ${TESSERA_NCCL_INCLUDE})
  target_compile_definitions(tessera_torch INTERFACE TESSERA_WITH_CUDA=1 USE_C10D_NCCL)
  # tessera's own kernels (src/model/*.cu) need the CUDA toolkit's nvcc, of the CUDA version the
  # wheel was built with; they use the shared runtime, the one libtorch_cuda loads.
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "80;86;89;90" CACHE STRING "GPU architectures of tessera's kernels")
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  file(GLOB _nvidia_libs LIST_DIRECTORIES true ${_nvidia}/*/lib)
  foreach(dir ${_nvidia_libs})
    list(APPEND _link_options "-Wl,-rpath-link,${dir}")
  endforeach()
endif()
target_link_libraries(tessera_torch INTERFACE ${_libs})
target_link_options(tessera_torch INTERFACE ${_link_options})
message(STATUS "tessera: CUDA ${TESSERA_CUDA}")
