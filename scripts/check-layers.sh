#!/usr/bin/env bash
# check-layers.sh — every #include in src/ stays inside the layers its file's
# layer may use, as src/layers.txt lists them (CTest runs it as the test
# check_layers, label lint). Prints each offending file:line and exits 1.
#
#   scripts/check-layers.sh [ROOT]     ROOT: the source tree (default: this one)
#
# A file belongs to the layer whose folder is the longest prefix of its path;
# a quoted include names a path under src/ or include/ (or one relative to
# the including file). Angle-bracket includes are outside libraries and are
# not checked.
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT" || exit 1
export LC_ALL=C

[ -f src/layers.txt ] || { echo "check-layers: src/layers.txt is missing" >&2; exit 1; }

# "file<TAB>line<TAB>included path" for every quoted include under src/.
includes() {
  find src -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z |
    xargs -0 -r grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' |
    sed -E 's/^([^:]*):([0-9]+):[^"]*"([^"]*)".*/\1\t\2\t\3/'
}

# Every file under src/ (sources only), so a file outside every layer is caught too.
sources() {
  find src -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort
}

{ sources | sed 's/^/S\t/'; includes | sed 's/^/I\t/'; } |
  awk -F'\t' -v root="$ROOT" '
  function layer_of(path,    best, bl, f, n) { # path relative to src/
    best = ""; bl = -1
    for (f in folder_layer) {
      n = length(f)
      if ((path == f || substr(path, 1, n + 1) == f "/") && n > bl) { best = folder_layer[f]; bl = n }
    }
    return best
  }
  function reach(l, seen,    i, n, u) { # the layers l may use, into seen[]
    if (l in seen) return
    seen[l] = 1
    n = split(uses[l], u, " ")
    for (i = 1; i <= n; i++) reach(u[i], seen)
  }
  function exists(p,    r, x) { r = (getline x < p); if (r >= 0) close(p); return r >= 0 }
  function normalize(p,    parts, out, n, i, k) { # folds "a/./b" and "a/../b"
    n = split(p, parts, "/"); k = 0
    for (i = 1; i <= n; i++) {
      if (parts[i] == "." || parts[i] == "") continue
      if (parts[i] == ".." && k > 0) { k--; continue }
      out[++k] = parts[i]
    }
    p = ""
    for (i = 1; i <= k; i++) p = p (i > 1 ? "/" : "") out[i]
    return p
  }
  BEGIN {
    while ((getline line < (root "/src/layers.txt")) > 0) {
      if (line ~ /^[[:space:]]*(#|$)/) continue
      n = split(line, w, /[[:space:]]+/)
      if (w[1] == "header") { header_layer[w[2]] = w[3]; continue }
      if (w[1] in uses) { printf "check-layers: src/layers.txt: layer %s twice\n", w[1] > "/dev/stderr"; bad = 1 }
      order[++nl] = w[1]
      uses[w[1]] = ""
      m = split(w[2], fs, ",")
      for (i = 1; i <= m; i++) folder_layer[fs[i]] = w[1]
      for (i = 3; i <= n; i++) if (w[i] != "-") uses[w[1]] = uses[w[1]] " " w[i]
    }
    # A layer may only use layers listed above it: the graph has no cycles.
    for (i = 1; i <= nl; i++) {
      m = split(uses[order[i]], u, " ")
      for (j = 1; j <= m; j++) {
        ok = 0
        for (k = 1; k < i; k++) if (order[k] == u[j]) ok = 1
        if (!ok) { printf "check-layers: src/layers.txt: %s uses %s, which is not a layer listed above it\n", order[i], u[j] > "/dev/stderr"; bad = 1 }
      }
    }
  }
  $1 == "S" {
    rel = substr($2, 5)
    if (layer_of(rel) == "") { printf "check-layers: %s: in no layer (add its folder to src/layers.txt)\n", $2 > "/dev/stderr"; bad = 1 }
    next
  }
  $1 == "I" {
    file = $2; ln = $3; inc = $4
    from = layer_of(substr(file, 5))
    if (from == "") next
    dir = file; sub(/\/[^\/]*$/, "", dir)
    if (exists(dir "/" inc)) {              # relative to the including file
      target = normalize(dir "/" inc)
      if (target !~ /^src\//) { printf "check-layers: %s:%s: \"%s\" leaves src/\n", file, ln, inc > "/dev/stderr"; bad = 1; next }
      to = layer_of(substr(target, 5))
    } else if (inc in header_layer) {       # a public header under include/
      to = header_layer[inc]
    } else if (exists("src/" inc)) {
      to = layer_of(normalize(inc))
    } else if (exists("include/" inc)) {
      printf "check-layers: %s:%s: include/%s has no \"header\" line in src/layers.txt\n", file, ln, inc > "/dev/stderr"; bad = 1; next
    } else {
      next                                  # a generated or system header
    }
    if (to == "" || to == from) next
    delete seen
    reach(from, seen)
    if (!(to in seen)) {
      printf "check-layers: %s:%s: layer %s includes \"%s\" of layer %s, which it does not use (src/layers.txt)\n", file, ln, from, inc, to > "/dev/stderr"
      bad = 1
    }
  }
  END {
    if (bad) { print "check-layers: FAILED (see above)" > "/dev/stderr"; exit 1 }
    print "check-layers: ok"
  }'
