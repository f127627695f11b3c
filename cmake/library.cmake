# The installable library: libregroup.so beside libregroup.a, and the install rules (headers,
# the regroup command, regroup.pc for pkg-config, the CMake package: regroup::regroup, the
# shared library, and with COMPONENTS static regroup::regroup_static, the static one).
#
# libregroup.so is made of the static library's own objects (compiled once, position
# independent), so every source a folder adds to `regroup` is in both. It exports the public
# API only: the functions declared in include/regroup/*.h, listed at build time into a linker
# version script (cmake/exports.cmake); everything else, the parts' private functions
# included, stays local.
#
# SONAME: libregroup.so.<major>.<minor> while the version is 0.x. Before 1.0 a minor release
# may change the ABI (semantic versioning gives 0.x no stability promise), so a program built
# against 0.1 must not load 0.2; patch releases keep the ABI. From 1.0 on it is the major alone.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(REGROUP_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(REGROUP_SOVERSION ${PROJECT_VERSION_MAJOR})
endif()

file(GLOB REGROUP_PUBLIC_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/regroup/*.h)
set(REGROUP_VERSION_SCRIPT ${PROJECT_BINARY_DIR}/libregroup.map)
add_custom_command(OUTPUT ${REGROUP_VERSION_SCRIPT}
  COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include
          -DOUT=${REGROUP_VERSION_SCRIPT} -P ${PROJECT_SOURCE_DIR}/cmake/exports.cmake
  DEPENDS ${REGROUP_PUBLIC_HEADERS} ${PROJECT_SOURCE_DIR}/cmake/exports.cmake
  COMMENT "Listing the public API of libregroup.so"
  VERBATIM)

# Its sources are regroup's objects ($<TARGET_OBJECTS> of a static library: CMake >= 3.15);
# linking `regroup` itself only brings its dependencies (every symbol of the archive is
# already defined by the objects, so no member is pulled).
add_library(regroup_shared SHARED $<TARGET_OBJECTS:regroup> ${REGROUP_VERSION_SCRIPT})
target_link_libraries(regroup_shared PRIVATE regroup)
if(CMAKE_CUDA_COMPILER)
  # comm_cuda.cu's host code needs the C++ runtime (static initialisation guards, exception
  # personality). CMake adds it to in-tree programs as a CUDA implicit library, but neither to
  # libregroup.so (linked as C) nor to programs of other projects that link libregroup.a, so
  # the static library's link interface names it.
  target_link_libraries(regroup PRIVATE stdc++)
endif()
target_include_directories(regroup_shared INTERFACE
                           $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_options(regroup_shared PRIVATE -Wl,--version-script=${REGROUP_VERSION_SCRIPT}
                    -Wl,--no-undefined)
set_target_properties(regroup_shared PROPERTIES
  OUTPUT_NAME regroup
  EXPORT_NAME regroup
  LINKER_LANGUAGE C
  VERSION ${PROJECT_VERSION}
  SOVERSION ${REGROUP_SOVERSION}
  LINK_DEPENDS ${REGROUP_VERSION_SCRIPT}
  INSTALL_RPATH_USE_LINK_PATH ON)
add_library(regroup::regroup ALIAS regroup_shared)
# The installed regroup command finds its shared dependencies (libcudart) where it was linked.
set_target_properties(regroup-bin PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

# ---- install ----------------------------------------------------------------------------

set(REGROUP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/regroup)
set(REGROUP_PKGCONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(TARGETS regroup_shared EXPORT regroupTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# libregroup.a as regroup::regroup_static, in an export set of its own that the package
# loads only for find_package(regroup COMPONENTS static), after finding its dependencies.
set_target_properties(regroup PROPERTIES EXPORT_NAME regroup_static)
install(TARGETS regroup EXPORT regroupStaticTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS regroup-bin RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/regroup
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")

install(EXPORT regroupTargets NAMESPACE regroup:: DESTINATION ${REGROUP_CMAKE_DIR})
install(EXPORT regroupStaticTargets NAMESPACE regroup:: DESTINATION ${REGROUP_CMAKE_DIR})
# The static target's link interface names the imported targets the parts link
# (PkgConfig::<PREFIX> of their pkg_check_modules, ZLIB::ZLIB, CUDA::cudart): the package
# makes the same ones. A part that links a new dependency adds it here too (test_install
# builds against regroup::regroup_static, and fails when one is missing).
set(REGROUP_CONFIG_PKG_MODULES "CURL libcurl JANSSON jansson ZSTD libzstd UCX ucx")
set(REGROUP_CONFIG_CUDA OFF)
if(CMAKE_CUDA_COMPILER)
  set(REGROUP_CONFIG_CUDA ON)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/regroupConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/regroupConfig.cmake
                              INSTALL_DESTINATION ${REGROUP_CMAKE_DIR})
# 0.x: a minor release may break the ABI, so only the same major.minor is compatible.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(REGROUP_COMPAT SameMinorVersion)
else()
  set(REGROUP_COMPAT SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/regroupConfigVersion.cmake
                                 COMPATIBILITY ${REGROUP_COMPAT})
install(FILES ${PROJECT_BINARY_DIR}/regroupConfig.cmake
              ${PROJECT_BINARY_DIR}/regroupConfigVersion.cmake
        DESTINATION ${REGROUP_CMAKE_DIR})

# regroup.pc: its prefix is the one `cmake --install` installs to (also when given with
# --prefix), so the file is written in two passes, the second at install time.
# Requires.private and Libs.private are what `pkg-config --static` adds to link libregroup.a:
# the parts' dependencies (rendezvous: libcurl, jansson; ckpt: libzstd; comm: ucx; train:
# zlib), threads, and for a CUDA build the CUDA runtime and the C++ runtime.
set(REGROUP_PC_PREFIX "@CMAKE_INSTALL_PREFIX@")
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(REGROUP_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(REGROUP_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
set(REGROUP_PC_REQUIRES_PRIVATE "libcurl jansson libzstd ucx zlib")
set(REGROUP_PC_LIBS_PRIVATE "-pthread")
if(CMAKE_CUDA_COMPILER)
  find_package(CUDAToolkit REQUIRED)
  string(APPEND REGROUP_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -lstdc++")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/regroup.pc.in ${PROJECT_BINARY_DIR}/regroup.pc.in @ONLY)
install(CODE "configure_file(\"${PROJECT_BINARY_DIR}/regroup.pc.in\"
                             \"${PROJECT_BINARY_DIR}/regroup.pc\" @ONLY)")
install(FILES ${PROJECT_BINARY_DIR}/regroup.pc DESTINATION ${REGROUP_PKGCONFIG_DIR})

# The Python package (python/regroup, pure Python over libregroup.so through ctypes), beside
# the library: <libdir>/python3/dist-packages/regroup by default (REGROUP_PYTHON_DIR, relative
# to the prefix or absolute). Its _libdir.py, written at install time like regroup.pc, records
# the library's directory, so that the package finds the library it was installed with
# whatever the prefix; PYTHONPATH=<that dir> makes it importable (Debian's python3 already
# searches /usr/lib/python3/dist-packages).
set(REGROUP_PYTHON_DIR ${CMAKE_INSTALL_LIBDIR}/python3/dist-packages CACHE STRING
    "Where cmake --install puts the Python package (relative to the prefix, or absolute)")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/regroup DESTINATION ${REGROUP_PYTHON_DIR}
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE PATTERN "_libdir.py" EXCLUDE)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(REGROUP_PY_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(REGROUP_PY_LIBDIR "@CMAKE_INSTALL_PREFIX@/${CMAKE_INSTALL_LIBDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/regroup_libdir.py.in
               ${PROJECT_BINARY_DIR}/regroup_libdir.py.in @ONLY)
install(CODE "configure_file(\"${PROJECT_BINARY_DIR}/regroup_libdir.py.in\"
                             \"${PROJECT_BINARY_DIR}/python/_libdir.py\" @ONLY)")
install(FILES ${PROJECT_BINARY_DIR}/python/_libdir.py DESTINATION ${REGROUP_PYTHON_DIR}/regroup)
