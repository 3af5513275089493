# SPDX-License-Identifier: MIT (see LICENSE)
# tests/tap.sh — TAP helpers shared by the shell tests (sourced by tests/test_*.sh, not run).
#   ok DESC / notok DESC       print the next numbered result line
#   check DESC COMMAND...      ok when COMMAND succeeds; else notok, with what the command left
#                              in $tmp/why (written with `why TEXT`, one line a reason) on the
#                              `not ok` line itself, and again in full as # diagnostics
#   free_port                  prints a TCP port for a rendezvous on this host: the kernel's
#                              pick, held in TIME_WAIT (as ddprun does: a loopback connection
#                              whose accepted end closes first), which keeps it out of every
#                              bind(port 0) and connect() on the host for a minute, so tests
#                              running beside this one cannot be handed it, while a server with
#                              SO_REUSEADDR (libddp's store, torch's TCPStore) binds it
# The `not ok` line carries the reason because it is what `prove -f` shows; the # lines show
# only under prove -v. So a reason names what was expected and what was found.
# The sourcing script creates $tmp (a scratch directory) first.
n=0
ok() { n=$((n + 1)); printf 'ok %d - %s\n' "$n" "$1"; }
notok() { n=$((n + 1)); printf 'not ok %d - %s\n' "$n" "$1"; }
check() {
    d=$1; shift
    rm -f "$tmp/why"
    if "$@"; then ok "$d"; else
        if [ -s "$tmp/why" ]; then
            notok "$d: $(why_line)"
            sed 's/^/#   /' "$tmp/why"
        else
            notok "$d: (the check wrote no reason)"
        fi
    fi
}
why() { printf '%s\n' "$*" >> "$tmp/why"; }
# why_line: $tmp/why as one line for a TAP description: lines joined with "; ", cut at 400
# characters, '#' escaped (a "# SKIP" or "# TODO" after an unescaped '#' would be a directive).
why_line() {
    awk '{ s = s (NR > 1 ? "; " : "") $0 } END { if (length(s) > 400) s = substr(s, 1, 400) " ..."; print s }' \
        "$tmp/why" | sed 's/#/\\#/g'
}
free_port() {
    python3 -c '
import socket
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0)); l.listen(1); port = l.getsockname()[1]
c = socket.create_connection(("127.0.0.1", port)); s, _ = l.accept()
s.close(); c.close(); l.close()   # the accepted end closes first: it is the one in TIME_WAIT
print(port)'
}
