#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/fake_nccl/build.sh OUTDIR [EXTRA_CFLAGS...] — build the fake CUDA runtime and NCCL.
#
#   OUTDIR/libcudart.so.13   fake_cudart.c (soname libcudart.so.13)
#   OUTDIR/libnccl.so.2      fake_nccl.c (soname libnccl.so.2), needs libcudart.so.13, found
#                            through RPATH $ORIGIN (DT_RPATH, not RUNPATH, so that it wins over
#                            LD_LIBRARY_PATH and the ld.so cache where the real CUDA libraries are)
#   OUTDIR/selftest          selftest.c (TAP: prove OUTDIR/selftest); it loads the two fakes
#                            from its own directory
#
# EXTRA_CFLAGS go to all three: e.g. -fsanitize=address,undefined -fno-omit-frame-pointer, or
# -fsanitize=thread (build the fakes and the selftest with the same sanitizer). CC defaults to cc.
# No CUDA header is needed.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [EXTRA_CFLAGS...]" >&2; exit 2; }
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
CC=${CC:-cc}
CFLAGS=${CFLAGS:--O2 -g}
mkdir -p "$out"
common="-std=c11 -Wall -Wextra -Werror -fPIC -pthread -fvisibility=hidden $CFLAGS"
# Every symbol resolved at link time, except with sanitizers (clang's runtime lives in the
# executable, so a sanitized library has undefined references by design).
zdefs=-Wl,-z,defs
[ $# -eq 0 ] || zdefs=
# shellcheck disable=SC2086
$CC $common "$@" -shared -Wl,-soname,libcudart.so.13 $zdefs \
    "$here/fake_cudart.c" -o "$out/libcudart.so.13"
# shellcheck disable=SC2086
$CC $common "$@" -shared -Wl,-soname,libnccl.so.2 $zdefs -Wl,--disable-new-dtags,-rpath,'$ORIGIN' \
    "$here/fake_nccl.c" "$out/libcudart.so.13" -o "$out/libnccl.so.2"
if [ -f "$here/selftest.c" ]; then
    # shellcheck disable=SC2086
    $CC -std=c11 -Wall -Wextra -Werror -pthread $CFLAGS "$@" "$here/selftest.c" -o "$out/selftest" -ldl
fi
