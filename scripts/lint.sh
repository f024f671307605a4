#!/usr/bin/env bash
# lint.sh — repository checks that need no build and no network (a second or
# two). scripts/test.sh runs it first and CTest runs it as the test `lint`
# (label lint). Each check prints the offending file:line and the script
# exits 1 if any check failed.
#
#   scripts/lint.sh            check the working tree (tracked and untracked,
#                              not ignored files)
#
# Checks:
#   diary      docs/ and the READMEs are product documentation: no accounts of
#              past work (sessions, leases, branches as history, "we tried")
#   refs       docs, READMEs and sources are self-contained: no "SEEDS" / "§" (RFC sections excepted)
#              references to planning documents, no ../shared paths
#   links      markdown links and `repo/paths` in backticks name files that
#              exist in the repository
#   devlogs    dev/ holds kernel labs, not run logs (*.log, run1/ ...)
#   filesize   source files stay under 1000 lines
#   knobs      (reserved: the knob table check goes here)
set -uo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C # byte-wise matching: the same result in every locale

fail=0
bad() { # check-name message...
  echo "lint[$1]: ${*:2}" >&2
  fail=1
}

# The files of the repository: tracked plus untracked-but-not-ignored when
# this is a git checkout, else everything but build outputs and caches.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  all_files() { git ls-files --cached --others --exclude-standard | while read -r f; do [ -e "$f" ] && echo "$f"; done; }
else
  all_files() { find . -type f -not -path './build*' -not -path './.cache/*' -not -path './.git/*' | sed 's|^\./||'; }
fi
FILES=$(all_files | sort -u)
pick() { grep -E "$1" <<<"$FILES" || true; } # files whose path matches an ERE
# A path (file or folder, "a/./b" and "a/../b" allowed) that is one of the
# repository's files or holds some: build outputs do not count.
in_repo() {
  local p
  p=$(realpath -m --relative-to=. "$1" 2>/dev/null) || return 1
  [ -e "$p" ] || return 1
  awk -v p="$p" 'index($0, p "/") == 1 || $0 == p { f = 1; exit } END { exit !f }' <<<"$FILES"
}

# Product documentation: docs/, the top-level and per-folder READMEs.
DOCS=$(pick '^(docs/.*\.md|README\.md|[a-z]+/README\.md)$')
# Text sources whose comments must be self-contained (fixtures and fuzz
# corpora hold outside data, not prose).
SOURCES=$(pick '^(src|include|bench|scripts|tests|dev)/' | grep -Ev '^tests/(fixtures|fuzz/corpus)' |
  grep -E '\.(c|h|cu|cuh|cc|cpp|sh|js|mjs|py|txt|cmake)$|CMakeLists\.txt$' || true)

# grep -n with a PCRE over a file list; prints file:line:text
scan() { # [-i] pattern files...
  local icase=()
  [ "$1" = -i ] && { icase=(-i); shift; }
  local pat=$1; shift
  [ $# -gt 0 ] || return 0
  grep -HnP "${icase[@]}" -- "$pat" "$@" 2>/dev/null || true
}

# ---- refs: references to documents outside the repository ----------------
check_refs() {
  local out
  # shellcheck disable=SC2086
  out=$( { scan 'SEEDS\b|(?<!RFC \d{4} )(?<!RFC \d{3} )§|\bseeds/|\b[Ss]eeds? 0[0-9]{2}\b' $DOCS $SOURCES
           scan '\.\./shared\b' $DOCS $SOURCES; } | grep -v '^scripts/lint\.sh:' | sort -u)
  [ -z "$out" ] && return
  sed 's/^/lint[refs]: /; s/$/ (describe the capability; name files in the repository only)/' <<<"$out" >&2
  fail=1
}

# ---- links: markdown links and backticked repository paths ---------------
check_links() {
  local f
  for f in $DOCS; do
    local dir
    dir=$(dirname "$f")
    # [text](target): relative targets must exist (anchors and URLs skipped)
    grep -noP '\]\(\K[^)\s]+(?=\))' "$f" | while IFS=: read -r ln target; do
      case "$target" in http://* | https://* | mailto:* | \#*) continue ;; esac
      target=${target%%#*}
      in_repo "$dir/$target" || in_repo "$target" ||
        echo "lint[links]: $f:$ln: link to $target, which is not in the repository"
    done
    # `src/...`-style paths at the start of a code span; placeholders skipped
    grep -noP '`\K(src|include|docs|dev|scripts|tests|bench|models|cmake)/[^`\s]*' "$f" |
      while IFS=: read -r ln path; do
        case "$path" in *'*'* | *'<'* | *'{'* | *'$'* | *'…'* | *...* | dev/build/*) continue ;; esac
        path=${path%%:*}
        path=${path%[.,;)]}
        in_repo "$path" || echo "lint[links]: $f:$ln: \`$path\` is not in the repository"
      done
  done >"${TMPDIR:-/tmp}/kiln-lint-links.$$"
  if [ -s "${TMPDIR:-/tmp}/kiln-lint-links.$$" ]; then
    cat "${TMPDIR:-/tmp}/kiln-lint-links.$$" >&2
    fail=1
  fi
  rm -f "${TMPDIR:-/tmp}/kiln-lint-links.$$"
}

# ---- devlogs: run logs committed under dev/ --------------------------------
check_devlogs() {
  local out
  out=$(pick '^dev/' | grep -E '\.log$|(^|/)run[0-9]+(/|$)|(^|/)(notes|NOTES)\.md$' || true)
  [ -z "$out" ] && return
  sed 's/^/lint[devlogs]: /; s/$/ (dev\/ keeps kernel labs; results go to docs\/perf.md)/' <<<"$out" >&2
  fail=1
}

# ---- filesize: source files over 1000 lines -------------------------------
# Exceptions: none. Add "path" lines here only with a reason beside each.
FILESIZE_EXCEPTIONS=""
check_filesize() {
  local f n
  for f in $(pick '^(src|include)/.*\.(c|h|cu|cuh)$'); do
    n=$(wc -l <"$f")
    [ "$n" -le 1000 ] && continue
    grep -qxF "$f" <<<"$FILESIZE_EXCEPTIONS" && continue
    bad filesize "$f has $n lines (split it: one concept per file, ~1000 lines at most)"
  done
}

# ---- knobs: reserved ------------------------------------------------------
# The KILN_* knob table check (every getenv("KILN_...") is in the table, the
# table and docs agree) is added here as check_knobs and called below.

# ---- diary: narratives of past work in product documentation -------------
check_diary() {
  local ord='first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|that|previous|earlier|last|same|next|one|each'
  local pats=(
    "\\b($ord) sessions?\\b"          # "the fifth session's tree", "this session"
    "\\bsessions?(?:'|’)s\\b"            # "the session's last commit"
    "\\blease[sd]?\\b"                 # device leases
    "\\bbranch(es)? \`[a-z0-9_-]+\`"  # branch `cudadec` as history
    "\\(branch [a-z0-9_-]+[),]"        # (branch pdl)
    "\\bmerged tree\\b"
    "\\bwe (tried|then|first|later|decided|found|added|wrote|dropped|switched|measured)\\b"
    "\\b(device|GPU) time ran out\\b"
    "\\bran out of (device|GPU) time\\b"
  )
  local p out
  # shellcheck disable=SC2086
  out=$(for p in "${pats[@]}"; do scan -i "$p" $DOCS; done | sort -u)
  [ -z "$out" ] && return
  sed 's/^/lint[diary]: /; s/$/ (describe the product; git keeps the history)/' <<<"$out" >&2
  fail=1
}

check_diary
check_refs
check_links
check_devlogs
check_filesize

if [ "$fail" = 0 ]; then
  echo "lint: ok"
else
  echo "lint: FAILED (see above)" >&2
fi
exit "$fail"
