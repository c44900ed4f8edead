# t_rooms.sh - the library's folders include one another one way only
# (common <- formats <- convert <- device <- engine <- runtime <- cli):
# tests/rooms.py on the tree, and on a copy of it with includes that break
# the chain, which it must name. Sourced by run.sh; see there for the helpers.

rooms_include_only_rooms_below() {
	if ! python3 tests/rooms.py . >"$T/out" 2>"$T/err"; then
		fail "$(cat "$T/out" "$T/err" | head -n 5)"
		return
	fi
	grep -q '^rooms: [1-9][0-9]* includes in [1-9][0-9]* files follow the chain' "$T/out" ||
		fail "tests/rooms.py said: $(head -n 3 "$T/out")"
}
cases rooms_include_only_rooms_below

# A copy of what the check reads, with three includes the chain forbids: the
# engine including the runtime, convert including the device, the runtime a
# test's header; and a room the Makefile builds that the chain lacks.
rooms_check_names_what_breaks_the_chain() {
	mkdir -p "$T/tree/tests/unit"
	cp -R common formats convert device engine runtime cli include Makefile "$T/tree/" &&
		cp tests/unit/testutil.h "$T/tree/tests/unit/" || fail "copying the tree"
	python3 tests/rooms.py "$T/tree" >"$T/out" 2>&1 || fail "the unchanged copy fails: $(head -n 3 "$T/out")"
	printf '#include "../runtime/open.h"\n' >>"$T/tree/engine/engine.c"
	printf '#include "../device/backend.h"\n' >>"$T/tree/convert/verify.c"
	printf '#include "../tests/unit/testutil.h"\n' >>"$T/tree/runtime/steps.c"
	python3 tests/rooms.py "$T/tree" >"$T/out" 2>&1
	rc=$?
	expect_rc 1
	expect_out 'engine/engine.c:'
	expect_out '#include "../runtime/open.h": engine/ may include only engine/, device/, convert/, formats/, common/ and include/ (runtime/ is above engine/)'
	expect_out 'convert/verify.c:'
	expect_out '#include "../device/backend.h": convert/ may include only convert/, formats/, common/ and include/ (device/ is above convert/)'
	expect_out 'runtime/steps.c:'
	expect_out '"../tests/unit/testutil.h"'
	expect_out 'tests/unit/testutil.h is in no room of the library'
	expect_out 'rooms: 3 include(s) break the chain'
	# a folder the library is built from that the chain does not name
	sed -i 's|^LIB_SRC  := $(wildcard |&extra/*.c |' "$T/tree/Makefile"
	python3 tests/rooms.py "$T/tree" >"$T/out" 2>&1
	rc=$?
	expect_rc 1
	expect_out 'Makefile: LIB_SRC builds the library from common, convert, device, engine, extra, formats, runtime'
}
cases rooms_check_names_what_breaks_the_chain
