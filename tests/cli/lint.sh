#!/usr/bin/env bash
# scripts/lint.sh on small trees built here: a clean tree passes, and each
# kind of defect (diary words, outside references, dead links and paths,
# run logs under dev/, an oversized source file) fails with its check named.
set -uo pipefail
SRC=${KILN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0

mk() { # a clean tree in $T/r (no git: the lint falls back to find)
  rm -rf "$T/r" && mkdir -p "$T/r/scripts" "$T/r/docs" "$T/r/src" "$T/r/dev/lab"
  cp "$SRC/scripts/lint.sh" "$T/r/scripts/"
  printf '# kiln\n\nSee [design](docs/design.md) and `src/a.c`.\n' >"$T/r/README.md"
  printf '# Design\n\nThe engine thread owns the KV pool; a session of requests is fine.\n' >"$T/r/docs/design.md"
  printf '/* a.c: one concept */\nint a(void) { return 0; }\n' >"$T/r/src/a.c"
  printf '// lab\n' >"$T/r/dev/lab/lab.cu"
}
expect() { # name want-rc check-name (the check must be named on a failure)
  local out rc
  out=$(bash "$T/r/scripts/lint.sh" 2>&1); rc=$?
  if [ "$rc" != "$2" ] || { [ -n "$3" ] && ! grep -q "lint\[$3\]" <<<"$out"; }; then
    echo "FAIL: $1: rc=$rc (want $2), output:"; echo "$out"; fails=$((fails + 1))
  else
    echo "ok: $1"
  fi
}

mk; expect "clean tree" 0 ""
mk; echo "Measured in the fifth session's tree." >>"$T/r/docs/design.md"; expect "session narrative" 1 diary
mk; echo "Two leases of the GPU machine." >>"$T/r/README.md"; expect "lease" 1 diary
mk; echo "As measured on branch \`cudadec\`." >>"$T/r/docs/design.md"; expect "branch as history" 1 diary
mk; echo "We tried a 3-stage ring." >>"$T/r/docs/design.md"; expect "we tried" 1 diary
# (the strings are assembled so that this file passes the lint itself)
mk; printf '/* batch-invariant (%s %s26) */\n' "SEE""DS" "$(printf '\302\247')" >>"$T/r/src/a.c"; expect "planning-document reference" 1 refs
mk; echo "Reference data lives in ..""/shared/oracle." >>"$T/r/docs/design.md"; expect "outside path" 1 refs
mk; echo "See [perf](docs/perf.md)." >>"$T/r/README.md"; expect "dead link" 1 links
mk; echo "Run \`scripts/gone.sh --bench\`." >>"$T/r/docs/design.md"; expect "dead path" 1 links
mk; mkdir -p "$T/r/dev/lab/run1"; echo x >"$T/r/dev/lab/run1/bench.log"; expect "run log under dev/" 1 devlogs
mk; seq 1001 | sed 's/^/\/\/ /' >"$T/r/src/big.c"; expect "1001-line source" 1 filesize

[ "$fails" = 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "all lint cases passed"
