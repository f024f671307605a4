# knob_line.sh — sourced by the shell tests that read kiln's stderr.
#
# The test environment sets KILN_* knobs (KILN_DEVICE=cpu at least), so
# every kiln command logs one INFO line at start-up that lists the knobs not
# at their defaults. KNOB_LINE_RE is the one description of that line in the
# tests (knobs.sh checks the line itself with it); drop_knob_line copies
# stdin without it, for tests that expect nothing else, or only an error or
# a result, on stderr.
#
#   source "$KILN_SRC/tests/knob_line.sh"
#   err=$("$KILN" generate ... 2>&1 >/dev/null | drop_knob_line)
KNOB_LINE_RE='INFO\] knobs not at their defaults: '
drop_knob_line() { grep -Ev "$KNOB_LINE_RE" || true; }
