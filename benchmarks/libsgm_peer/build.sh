#!/usr/bin/env bash
# Builds benchmarks/libsgm_peer/peer.cu against libSGM's sources (e4c669b, the version of
# issue 13's table) for the GPU at hand, with nvcc alone (no CMake, no OpenCV):
#
#   git clone https://github.com/fixstars/libSGM && git -C libSGM checkout e4c669b
#   bash benchmarks/libsgm_peer/build.sh libSGM /tmp/libsgm_peer [sm_90]
#   python benchmarks/gpu.py --libsgm-peer /tmp/libsgm_peer
set -euo pipefail
src=${1:?usage: build.sh LIBSGM_SOURCE_DIR OUTPUT [ARCH]}
out=${2:?usage: build.sh LIBSGM_SOURCE_DIR OUTPUT [ARCH]}
arch=${3:-sm_90}
here=$(cd "$(dirname "$0")" && pwd)
command -v nvcc > /dev/null || { echo "build.sh: nvcc not found: put CUDA's bin folder on PATH" >&2; exit 2; }
[ -f "$src/src/libsgm.cpp" ] || { echo "build.sh: $src holds no libSGM sources (src/libsgm.cpp)" >&2; exit 2; }
inc=$(mktemp -d)
trap 'rm -rf "$inc"' EXIT
# (libSGM's CMake writes include/libsgm_config.h from its .in; a static build needs no more)
printf '#ifndef __LIBSGM_CONFIG_H__\n#define __LIBSGM_CONFIG_H__\n#define LIBSGM_VERSION 3.1.0\n#endif\n' \
  > "$inc/libsgm_config.h"
nvcc -O3 -std=c++17 -arch="$arch" -I"$inc" -I"$src/include" -o "$out" "$here/peer.cu" \
  "$src"/src/{census_transform,check_consistency,correct_disparity_range,cost_aggregation,cuda_utils,median_filter,winner_takes_all}.cu \
  "$src"/src/{device_allocator,device_image,libsgm}.cpp
echo "built $out ($arch)"
