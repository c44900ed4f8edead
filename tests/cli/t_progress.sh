# t_progress.sh - progress lines: on a terminal only (the command is run
# under a pseudo-terminal here), never with --quiet, never into a pipe or a
# file. Sourced by run.sh; see there for the helpers.

# run_tty ARGS...: run "$ARENA" ARGS with stderr on a pseudo-terminal (stdout
# to $T/out); what the terminal got goes to $T/tty, the exit status to $rc.
run_tty() {
	LAST_CMD="arena $* (stderr on a terminal)"
	python3 - "$T/tty" "$T/out" "$ARENA" "$@" <<'PY'
import os, pty, subprocess, sys
master, slave = pty.openpty()
with open(sys.argv[2], "wb") as out:
    p = subprocess.Popen(sys.argv[3:], stdin=subprocess.DEVNULL, stdout=out, stderr=slave)
os.close(slave)
got = b""
while True:
    try:
        b = os.read(master, 65536)
    except OSError:  # EIO: the other side is closed
        break
    if not b:
        break
    got += b
open(sys.argv[1], "wb").write(got)
sys.exit(p.wait())
PY
	rc=$?
}

# The terminal shows one progress line for LABEL, redrawn in place, that
# reached 100% and was ended with a newline.
expect_progress() {
	python3 - "$T/tty" "$1" <<'PY' || fail "no progress line for '$1' on the terminal: $(od -c "$T/tty" | head -n 3)"
import sys
t = open(sys.argv[1], "rb").read().decode()
label = sys.argv[2]
assert ("\r%s: " % label) in t, "no line"
last = t.rsplit("\r%s: " % label, 1)[1]
line = last.split("\n", 1)[0]
assert "(100%)" in line and ("GB/s" in line or "MB/s" in line), line
assert "\n" in last, "the line was not ended"
PY
}

expect_no_tty_progress() {
	if [ -s "$T/tty" ] && grep -q "$(printf '\r')" "$T/tty"; then
		fail "a progress line on the terminal: $(od -c "$T/tty" | head -n 2)"
	fi
}

# Not a terminal: nothing but what the command prints anyway.
expect_no_progress() {
	if grep -q "$(printf '\r')" "$T/err"; then
		fail "a progress line on stderr, which is not a terminal"
	fi
}

progress_on_a_terminal() {
	run_tty synth --layout flux-tiny --seed 1 -o "$T/m.safetensors"
	expect_rc 0
	expect_progress synth
	run_tty convert "$T/m.safetensors" -o "$T/m.arena"
	expect_rc 0
	expect_progress convert
	run_tty verify "$T/m.arena"
	expect_rc 0
	expect_progress verify
	expect_out "ok: "
	run_tty export "$T/m.arena" -o "$T/back.safetensors"
	expect_rc 0
	expect_progress export
	cmp -s "$T/m.safetensors" "$T/back.safetensors" || fail "export changed bytes"
	run_tty load "$T/m.arena" --backend sim --no-probe
	expect_rc 0
	expect_progress load
	run_tty load "$T/m.safetensors" --backend sim --no-probe --vram-cap 400K
	expect_rc 0
	expect_progress load
}

progress_quiet_on_a_terminal() {
	run_tty synth --layout flux-tiny --seed 1 -o "$T/m.safetensors" --quiet
	expect_rc 0
	expect_no_tty_progress
	expect_no_out
	run_tty convert "$T/m.safetensors" -o "$T/m.arena" -q
	expect_rc 0
	expect_no_tty_progress
	run_tty verify "$T/m.arena" --quiet
	expect_rc 0
	expect_no_tty_progress
	expect_out "ok: "
	run_tty export "$T/m.arena" -o "$T/back.safetensors" -q
	expect_rc 0
	expect_no_tty_progress
	run_tty load "$T/m.arena" --backend sim --no-probe -q
	expect_rc 0
	expect_no_tty_progress
}

progress_not_a_terminal() {
	run synth --layout flux-tiny --seed 1 -o "$T/m.safetensors"
	expect_rc 0
	expect_no_err
	run convert "$T/m.safetensors" -o "$T/m.arena"
	expect_rc 0
	expect_no_err
	run verify "$T/m.arena"
	expect_rc 0
	expect_no_err
	run export "$T/m.arena" -o "$T/back.safetensors"
	expect_rc 0
	expect_no_err
	run load "$T/m.arena" --backend sim --no-probe
	expect_rc 0
	expect_no_progress
}

# A failure after the line was drawn: the error is a line of its own.
progress_then_error() {
	run_tty synth --layout flux-tiny --seed 1 -o "$T/m.safetensors"
	python3 - "$T/m.safetensors" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[-100] ^= 0xFF
open(sys.argv[1], "wb").write(b)
PY
	"$ARENA" convert -q "$T/m.safetensors" -o "$T/m.arena" || fail "convert"
	python3 - "$T/m.arena" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[-5000] ^= 0xFF
open(sys.argv[1], "wb").write(b)
PY
	run_tty verify "$T/m.arena"
	expect_rc 1
	python3 - "$T/tty" <<'PY' || fail "the error line does not start a line of its own"
import sys
t = open(sys.argv[1], "rb").read().decode()
assert "error: " in t
assert t.split("error: ", 1)[0].endswith("\n"), repr(t[-300:])
PY
}

cases progress_on_a_terminal progress_quiet_on_a_terminal progress_not_a_terminal progress_then_error
