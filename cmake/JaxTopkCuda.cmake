# Which CUDA toolchain builds the CUDA extension, and, under JAX_TOPK_CUDA=AUTO, whether it works.
#
# jax_topk_choose_cuda_toolchain() sets JAX_TOPK_BUILD_CUDA (ON or OFF) and
# JAX_TOPK_CUDA_SKIPPED_BECAUSE (why not, "" when ON). The compiler, the first found wins:
#   1. one named by the user: -DCMAKE_CUDA_COMPILER=... or the CUDACXX environment variable;
#   2. the CUDA toolchain wheels of the Python environment being built for (site-packages/
#      nvidia/cu13 from `pip install "cuda-toolkit[nvcc,cccl]"`), if complete: the CUDA 13 that
#      jax[cuda13] runs on, and no system toolkit needed;
#   3. nvcc on the PATH, else under CUDA_HOME or CUDA_PATH.
# Under AUTO the compiler must then build cmake/cuda_probe (the kernels' headers, sm_80 warp
# reductions, the static runtime, for CMAKE_CUDA_ARCHITECTURES); if it cannot, the build goes on
# with the CPU extension alone and says why. Under ON any failure stops the build.

# The nvcc of a complete CUDA wheel tree, or "" and in `note_var` what was missing and where.
function(_jax_topk_find_cuda_wheels nvcc_var note_var)
  # The environment's own site-packages besides sys.path: an isolated build (a plain
  # `pip install .`) takes them off sys.path, but the toolchain is a program, not an import.
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [[
import site, sys, sysconfig
dirs = [*sys.path, sysconfig.get_path("purelib"), sysconfig.get_path("platlib"),
        site.getusersitepackages()]
print(";".join(dict.fromkeys(d for d in dirs if d)))]]
    OUTPUT_VARIABLE _site_dirs OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _status)
  set(${nvcc_var} "" PARENT_SCOPE)
  set(${note_var} "" PARENT_SCOPE)
  if(NOT _status EQUAL 0)
    return()
  endif()
  foreach(_dir IN LISTS _site_dirs)
    set(_root "${_dir}/nvidia/cu13")
    if(NOT EXISTS "${_root}/bin/nvcc")
      continue()
    endif()
    set(_missing "")
    if(NOT EXISTS "${_root}/include/cccl/cub/cub.cuh")
      list(APPEND _missing "CCCL (nvidia-cuda-cccl)")
    endif()
    if(NOT EXISTS "${_root}/lib/libcudart_static.a" OR NOT EXISTS "${_root}/include/cuda_runtime.h")
      list(APPEND _missing "the runtime (nvidia-cuda-runtime)")
    endif()
    if(NOT EXISTS "${_root}/nvvm/bin/cicc")
      list(APPEND _missing "NVVM (nvidia-nvvm)")
    endif()
    if(_missing)
      list(JOIN _missing " and " _missing)
      set(${note_var} "; ${_root} has nvcc but not ${_missing}: pip install \"cuda-toolkit[nvcc,cccl]\""
          PARENT_SCOPE)
    else()
      set(${nvcc_var} "${_root}/bin/nvcc" PARENT_SCOPE)
      set(${note_var} "" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

macro(jax_topk_choose_cuda_toolchain)
  set(JAX_TOPK_BUILD_CUDA OFF)
  set(JAX_TOPK_CUDA_SKIPPED_BECAUSE "")
  if(JAX_TOPK_CUDA STREQUAL "OFF")
    set(JAX_TOPK_CUDA_SKIPPED_BECAUSE "built with JAX_TOPK_CUDA=OFF")
  else()
    # A search that found nothing is not remembered: installing a toolkit and rebuilding in the
    # same build folder then finds it.
    if(DEFINED CMAKE_CUDA_COMPILER AND NOT CMAKE_CUDA_COMPILER)
      unset(CMAKE_CUDA_COMPILER CACHE)
    endif()
    set(_wheel_note "")
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
      _jax_topk_find_cuda_wheels(_wheel_nvcc _wheel_note)
      if(_wheel_nvcc)
        message(STATUS "jax_topk: CUDA toolchain from the Python environment's wheels: ${_wheel_nvcc}")
        set(ENV{CUDACXX} "${_wheel_nvcc}")
        # The runtime wheel's libraries lie in lib/; the nvcc.profile of some nvcc wheels (13.0)
        # names lib64/ only, and then not even CMake's compiler check links.
        cmake_path(GET _wheel_nvcc PARENT_PATH _wheel_bin)
        cmake_path(GET _wheel_bin PARENT_PATH _wheel_root)
        set(ENV{CUDAFLAGS} "-L${_wheel_root}/lib $ENV{CUDAFLAGS}")
      else()
        # CMake itself looks only on the PATH; a toolkit named by CUDA_HOME or CUDA_PATH counts too.
        find_program(_path_nvcc nvcc NO_CACHE NO_DEFAULT_PATH PATHS ENV PATH)
        foreach(_home IN ITEMS "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}")
          if(NOT _path_nvcc AND _home AND EXISTS "${_home}/bin/nvcc")
            set(ENV{CUDACXX} "${_home}/bin/nvcc")
            break()
          endif()
        endforeach()
      endif()
    endif()

    # An explicit list, never `native`: a machine with nvcc and no GPU must build.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    # The kernels use sm_80 warp reductions (__reduce_add_sync): say so at configure time rather
    # than with a compiler error deep in a kernel.
    foreach(_arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
      string(REGEX MATCH "^[0-9]+" _arch_number "${_arch}")
      if(_arch_number AND _arch_number LESS 80)
        message(FATAL_ERROR "jax_topk: CMAKE_CUDA_ARCHITECTURES has ${_arch}, below sm_80, which "
                            "the kernels need; use 90 or 90a (Hopper) or at least 80")
      endif()
    endforeach()

    if(JAX_TOPK_CUDA STREQUAL "ON")
      set(JAX_TOPK_BUILD_CUDA ON)
    else()
      include(CheckLanguage)
      check_language(CUDA)
      if(NOT CMAKE_CUDA_COMPILER)
        set(JAX_TOPK_CUDA_SKIPPED_BECAUSE
            "no CUDA compiler found (CUDACXX, the Python environment's nvidia/cu13 wheels, nvcc on the PATH, CUDA_HOME)${_wheel_note}")
      else()
        _jax_topk_probe_cuda(_probe_error)
        if(_probe_error)
          set(JAX_TOPK_CUDA_SKIPPED_BECAUSE "${_probe_error}")
        else()
          set(JAX_TOPK_BUILD_CUDA ON)
        endif()
      endif()
    endif()
  endif()
  if(NOT JAX_TOPK_BUILD_CUDA)
    message(STATUS "jax_topk: building the CPU extension only: ${JAX_TOPK_CUDA_SKIPPED_BECAUSE}")
  endif()
endmacro()

# Builds cmake/cuda_probe with the chosen compiler; `error_var` is "" or why it failed. A CMake
# of its own (not try_compile): the probe's configure errors then come back as its output too.
function(_jax_topk_probe_cuda error_var)
  set(_flags "-DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}"
             "-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}"
             "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=Release")
  if(CMAKE_CUDA_HOST_COMPILER)
    list(APPEND _flags "-DCMAKE_CUDA_HOST_COMPILER=${CMAKE_CUDA_HOST_COMPILER}")
  endif()
  if(DEFINED CMAKE_CUDA_FLAGS)  # from an earlier configure; on the first, CUDAFLAGS still holds them
    list(APPEND _flags "-DCMAKE_CUDA_FLAGS=${CMAKE_CUDA_FLAGS}")
  endif()
  if(CMAKE_MAKE_PROGRAM)
    list(APPEND _flags "-DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}")
  endif()
  message(CHECK_START "jax_topk: probing ${CMAKE_CUDA_COMPILER} for ${CMAKE_CUDA_ARCHITECTURES}")
  set(_probe_dir "${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/jax_topk_cuda_probe")
  file(REMOVE_RECURSE "${_probe_dir}")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_SOURCE_DIR}/cmake/cuda_probe" -B "${_probe_dir}"
            -G "${CMAKE_GENERATOR}" ${_flags}
    COMMAND_ECHO NONE RESULT_VARIABLE _status OUTPUT_VARIABLE _output ERROR_VARIABLE _output)
  if(_status EQUAL 0)
    execute_process(COMMAND "${CMAKE_COMMAND}" --build "${_probe_dir}"
                    RESULT_VARIABLE _status OUTPUT_VARIABLE _output ERROR_VARIABLE _output)
  endif()
  if(_status EQUAL 0)
    message(CHECK_PASS "works")
    set(${error_var} "" PARENT_SCOPE)
  else()
    message(CHECK_FAIL "failed")
    string(REGEX MATCHALL "[^\n]*[Ee]rror[^\n]*" _errors "${_output}")
    list(SUBLIST _errors 0 3 _errors)
    list(JOIN _errors " | " _errors)
    set(${error_var} "the CUDA compiler ${CMAKE_CUDA_COMPILER} failed the probe build (cmake/cuda_probe): ${_errors}"
        PARENT_SCOPE)
  endif()
endfunction()
