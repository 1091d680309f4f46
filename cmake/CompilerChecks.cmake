# Compiler checks that guard results, not speed.
#
# Integer dot products and the vectorizer. The quantized kernels' reference loops sum level * int8 products, and a
# vectorizer that turns such a loop into byte dot-product instructions can get the signedness wrong: GCC 12.2 with
# AVX-512 VNNI (-march=native on such CPUs) computes sum((nibble - 8) * int8) with unsigned bytes and loses the -8,
# so the scalar Q4_0 kernel gave wrong sums. Two defences:
#   - files that define results (the scalar and reference kernels) and files already vectorized by hand (the AVX2 and
#     AVX-512 levels) are always compiled without the auto-vectorizer: what they compute cannot depend on it;
#   - every other CPU file is compiled with the flags of the build, so a probe (cmake/probes/int_dot_products.cpp)
#     compiles and runs the loop shapes the kernels use with those flags. Where a sum comes out wrong, or the probe
#     cannot run here (flags for another CPU), every CPU file is compiled without the auto-vectorizer.
# Sets strata_novec_flags (the flags that turn the auto-vectorizer off) and strata_codegen_flags (added to every CPU
# file: empty, or strata_novec_flags where the probe did not pass).

if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    set(strata_novec_flags -fno-vectorize -fno-slp-vectorize)
else()
    set(strata_novec_flags -fno-tree-vectorize)
endif()

# Runs the probe with `flags` (a list); sets <out_var> to "ok", "wrong: <what it printed>" or "unknown: <why>".
function(strata_probe_int_dot flags out_var)
    string(TOUPPER "${CMAKE_BUILD_TYPE}" build_type)
    separate_arguments(config_flags UNIX_COMMAND "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${build_type}}")
    try_run(run_rc compile_ok ${CMAKE_BINARY_DIR}/cmake-probes/int_dot
            ${CMAKE_SOURCE_DIR}/cmake/probes/int_dot_products.cpp
            COMPILE_DEFINITIONS ${config_flags} ${flags}
            CXX_STANDARD 20
            COMPILE_OUTPUT_VARIABLE compile_out
            RUN_OUTPUT_VARIABLE run_out)
    if(NOT compile_ok)
        set(${out_var} "unknown: the probe did not compile" PARENT_SCOPE)
    elseif("${run_rc}" STREQUAL "0")
        set(${out_var} "ok" PARENT_SCOPE)
    elseif("${run_rc}" STREQUAL "3")
        string(STRIP "${run_out}" run_out)
        set(${out_var} "wrong: ${run_out}" PARENT_SCOPE)
    else()
        set(${out_var} "unknown: the probe could not run here (${run_rc})" PARENT_SCOPE)
    endif()
endfunction()

set(strata_codegen_flags "")
strata_probe_int_dot("${strata_arch_flags}" strata_int_dot)
if(NOT strata_int_dot STREQUAL "ok")
    set(strata_codegen_flags ${strata_novec_flags})
    strata_probe_int_dot("${strata_arch_flags};${strata_novec_flags}" strata_int_dot_novec)
    if(strata_int_dot MATCHES "^wrong" AND strata_int_dot_novec MATCHES "^wrong")
        message(FATAL_ERROR "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} computes integer dot products "
                            "wrongly with '${strata_arch_flags}', even without the auto-vectorizer "
                            "(${strata_int_dot_novec}); use another compiler or -DSTRATA_NATIVE=OFF")
    endif()
    message(STATUS "Integer dot-product probe with '${strata_arch_flags}': ${strata_int_dot}; CPU code is "
                   "compiled with ${strata_novec_flags} (slower float loops, right results)")
else()
    message(STATUS "Integer dot-product probe with '${strata_arch_flags}': ok")
endif()
