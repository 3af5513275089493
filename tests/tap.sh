# tests/tap.sh — TAP helpers shared by the shell tests (sourced by tests/test_*.sh, not run).
#   ok DESC / notok DESC       print the next numbered result line
#   check DESC COMMAND...      ok when COMMAND succeeds; else notok, and what the command left
#                              in $tmp/why (written with `why TEXT`) as # diagnostics
# The sourcing script creates $tmp (a scratch directory) first.
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; }
check() {
    d=$1; shift
    rm -f "$tmp/why"
    if "$@"; then ok "$d"; else
        notok "$d"
        [ -s "$tmp/why" ] && sed 's/^/#   /' "$tmp/why"
    fi
}
why() { printf '%s\n' "$*" >> "$tmp/why"; }
