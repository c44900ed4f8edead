# t_load_ring.sh - arena load's read ring is no larger than the bytes to read
# (and the pinned budget), and the report says when the request was lowered.
# Sourced by run.sh.

load_ring_capped_by_the_file() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	# --pin-budget keeps the ring small even where it is not capped by the file
	run load "$T/f.arena" --backend sim --threads 256 --slots 64 --slot-size 1G --pin-budget 256M --no-probe --json
	expect_rc 0
	expect_err "note: "
	expect_err "ring"
	python3 -c '
import json, os, sys
d = json.load(sys.stdin)
size = os.path.getsize(sys.argv[1])
r = d["ring"]
assert d["ring_bytes"] == r["bytes"] == r["threads"] * r["slots_per_thread"] * r["slot_bytes"], d
assert d["ring_bytes"] <= size + 4096 * d["threads"], ("ring larger than the file", d["ring_bytes"], size)
assert r["requested_bytes"] == 256 * 64 * 2**30, r
assert r["lowered_by"] == ["bytes_to_read"], r
assert d["threads"] == r["threads"] <= 2, d' "$T/f.arena" <"$T/out" || fail "load --json ring"
	run load "$REF/tiny_flux.safetensors" --backend sim --threads 256 --slots 64 --slot-size 1G --pin-budget 256M --no-probe --json
	expect_rc 0
	expect_err "note: "
	python3 -c '
import json, os, sys
d = json.load(sys.stdin)
size = os.path.getsize(sys.argv[1])
assert d["ring_bytes"] <= size + 4096 * d["threads"], ("ring larger than the file", d["ring_bytes"], size)' \
		"$REF/tiny_flux.safetensors" <"$T/out" || fail "load --json ring (safetensors)"
	# a request that fits says nothing
	run load "$T/f.arena" --backend sim --threads 1 --slots 2 --slot-size 64K --no-probe --json
	expect_rc 0
	expect_no_err
	python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["ring_bytes"] == 2 * 65536 and d["ring"]["lowered_by"] == [], d' <"$T/out" || fail "load --json ring as asked"
}

# The pinned budget lowers the ring too, and the note says so.
load_ring_capped_by_the_budget() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena" --chunk-size 64K
	run load "$T/f.arena" --backend sim --threads 2 --slots 4 --slot-size 64K --pin-budget 200K --no-probe --json
	expect_rc 0
	# (where the OS allows less than this ring pinned, it is pageable instead)
	python3 -c '
import json, sys
d = json.load(sys.stdin)
err = open(sys.argv[1]).read()
if d["ring_pinned"]:
    assert d["ring_bytes"] <= 200 * 1024 and "pin_budget" in d["ring"]["lowered_by"], d
    assert "pinned budget" in err, err' "$T/err" <"$T/out" || fail "load --json ring in the budget"
}

cases load_ring_capped_by_the_file load_ring_capped_by_the_budget
