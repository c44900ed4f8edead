# scripts/sancheck.sh, which runs the unit suites: a sanitizer report fails
# the run even when the command passes; a process whose AddressSanitizer
# could not reserve its shadow memory at start-up (nothing ran under it)
# runs the command once more, and only that.

sancheck_reports_and_shadow_failures() {
	cat >"$T/flaky.sh" <<'EOS'
n=$(cat "$1" 2>/dev/null || echo 0); n=$((n + 1)); echo $n >"$1"
if [ $n = 1 ]; then
	echo "==1==ERROR: AddressSanitizer failed to allocate 0x2000000000000000 (2305843009213693952) bytes at address 7fff8000 (errno: 12)"
	echo "==1==ReserveShadowMemoryRange failed while trying to map 0x2000000000000000 bytes. Perhaps you're using ulimit -v"
fi
echo "run $n"
EOS
	LAST_CMD="sancheck.sh (shadow reservation failed once)"
	sh scripts/sancheck.sh sh "$T/flaky.sh" "$T/count" >"$T/out" 2>"$T/err"
	rc=$?
	expect_rc 0
	expect_out "running again"
	expect_out "run 2"
	[ "$(cat "$T/count")" = 2 ] || fail "ran $(cat "$T/count") times, want 2"
	LAST_CMD="sancheck.sh (shadow reservation failed twice)"
	sh scripts/sancheck.sh sh -c 'echo "==1==ERROR: AddressSanitizer failed to allocate 0x20 bytes at address 7f (errno: 12)"; echo ReserveShadowMemoryRange failed' >"$T/out" 2>"$T/err"
	rc=$?
	expect_rc 1
	expect_out "sanitizer reports above; failing"
	LAST_CMD="sancheck.sh (a real report beside a shadow failure)"
	sh scripts/sancheck.sh sh -c 'echo "==1==ERROR: AddressSanitizer: heap-use-after-free"; echo ReserveShadowMemoryRange failed' >"$T/out" 2>"$T/err"
	rc=$?
	expect_rc 1
	grep -q "running again" "$T/out" && fail "ran again for a real report"
	LAST_CMD="sancheck.sh (a leak at exit, the command passing)"
	sh scripts/sancheck.sh sh -c 'echo "==1==ERROR: LeakSanitizer: detected memory leaks"' >"$T/out" 2>"$T/err"
	rc=$?
	expect_rc 1
	LAST_CMD="sancheck.sh (exit 3, no report)"
	sh scripts/sancheck.sh sh -c 'exit 3' >"$T/out" 2>"$T/err"
	rc=$?
	expect_rc 3
}

cases sancheck_reports_and_shadow_failures
