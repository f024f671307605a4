#!/usr/bin/env bash
# scripts/check-layers.sh: the source tree passes, and on small trees built
# here each kind of layering defect fails with the offending file named.
set -uo pipefail
SRC=${KILN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0

expect() { # name want-rc text-the-output-must-hold root
  local out rc
  out=$(bash "$SRC/scripts/check-layers.sh" "$4" 2>&1); rc=$?
  if [ "$rc" != "$2" ] || ! grep -qF -- "$3" <<<"$out"; then
    echo "FAIL: $1: rc=$rc (want $2, output holding '$3'), output:"; echo "$out"; fails=$((fails + 1))
  else
    echo "ok: $1"
  fi
}
mk() { # a small clean tree in $T/r
  rm -rf "$T/r" && mkdir -p "$T/r/src/base" "$T/r/src/model" "$T/r/src/server" "$T/r/src/backend/cpu" \
    "$T/r/src/tensor" "$T/r/include/kiln"
  cat >"$T/r/src/layers.txt" <<'L'
# layer   folders      uses
base      base         -
tensor    tensor       base
cpu       backend/cpu  tensor
backend   backend      cpu
model     model        tensor
server    server       model backend
header    kiln/api.h   server
L
  printf '#include <stdio.h>\n' >"$T/r/src/base/log.h"
  printf '#include "base/log.h"\n#include "log.h"\n' >"$T/r/src/base/log.c"
  printf '#include "base/log.h"\n' >"$T/r/src/tensor/backend.h"
  printf '#include "tensor/backend.h"\n' >"$T/r/src/backend/cpu/cpu.c"
  printf '#include "backend/cpu/../../tensor/backend.h"\n' >"$T/r/src/backend/registry.c"
  printf '#include "tensor/backend.h"\n#include "base/log.h"\n' >"$T/r/src/model/model.c"
  printf '#include "model/../base/log.h"\n#include "backend/cpu/cpu.c"\n#include "kiln/api.h"\n' >"$T/r/src/server/server.c"
  printf '/* api */\n' >"$T/r/include/kiln/api.h"
}

expect "the source tree" 0 "check-layers: ok" "$SRC"
mk; expect "clean small tree" 0 "check-layers: ok" "$T/r"
mk; printf '#include "server/server.h"\n' >>"$T/r/src/model/model.c"; touch "$T/r/src/server/server.h"
expect "model includes server" 1 "src/model/model.c:3: layer model includes \"server/server.h\" of layer server" "$T/r"
mk; printf '#include "backend/cpu/cpu.c"\n' >>"$T/r/src/tensor/backend.h"
expect "interface includes an implementation" 1 "src/tensor/backend.h:2: layer tensor includes" "$T/r"
mk; printf '#include "../server/server.c"\n' >>"$T/r/src/model/model.c"
expect "relative include upwards" 1 "src/model/model.c:3: layer model includes" "$T/r"
mk; printf '#include "kiln/api.h"\n' >>"$T/r/src/base/log.c"
expect "public header of a higher layer" 1 "src/base/log.c:3: layer base includes \"kiln/api.h\" of layer server" "$T/r"
mk; printf '/* x */\n' >"$T/r/include/kiln/other.h"; printf '#include "kiln/other.h"\n' >>"$T/r/src/server/server.c"
expect "public header without a layer" 1 "include/kiln/other.h has no \"header\" line" "$T/r"
mk; mkdir -p "$T/r/src/extra"; printf 'int x;\n' >"$T/r/src/extra/x.c"
expect "folder in no layer" 1 "src/extra/x.c: in no layer" "$T/r"
mk; sed -i 's/^tensor    tensor       base$/tensor    tensor       base model/' "$T/r/src/layers.txt"
expect "a cycle in layers.txt" 1 "tensor uses model, which is not a layer listed above it" "$T/r"

[ "$fails" = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all layering checks behave"
