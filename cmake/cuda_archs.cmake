# JAX_FLASH_CUDA_ARCHS=auto: which CUDA targets to build.
# (Included by CMakeLists.txt; tests/test_build_config.py runs it with cmake -P.)
# "auto" builds for the GPUs this machine has (nvidia-smi), the way a user
# installing from source wants it: an H100 box compiles sm_90a only, in half
# the time. Without a visible GPU (CI, wheel builders) it builds 80;90a.
function(jax_flash_detect_archs out)
  set(_archs "")
  find_program(_smi nvidia-smi)
  if(_smi)
    execute_process(COMMAND ${_smi} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE _caps RESULT_VARIABLE _rc ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_rc EQUAL 0)
      string(REPLACE "\n" ";" _caps "${_caps}")
      foreach(_cap IN LISTS _caps)
        string(STRIP "${_cap}" _cap)
        if(_cap MATCHES "^9\\.0$")
          list(APPEND _archs 90a)
        elseif(_cap MATCHES "^[0-9]+\\.[0-9]+$" AND NOT _cap VERSION_LESS 8.0)
          # sm_80 code runs on every 8.x GPU; newer GPUs JIT its embedded PTX.
          list(APPEND _archs 80)
        endif()
      endforeach()
    endif()
  endif()
  list(REMOVE_DUPLICATES _archs)
  if(NOT _archs)
    set(_archs 80 90a)
  endif()
  set(${out} "${_archs}" PARENT_SCOPE)
endfunction()
