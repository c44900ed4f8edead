# t_cache.sh - arena cache list|verify|prune over a cache of converted
# images as python/arena_gpu/_cache.py writes it (ROOT/KEY/image.arena and
# entry.json, ROOT/KEY.lock): entries listed and verified, bad ones named and
# removed, prune by last use, an entry in use or being made left alone, the
# root's rules. Sourced by run.sh; see there for the helpers.

# cache_entry ROOT KEY LABEL: an entry of the tiny Flux fixture, as the
# package writes one.
cache_entry() {
	mkdir -p -m 700 "$1" "$1/$2" || return 1
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$1/$2/image.arena" || return 1
	python3 - "$1/$2" "$2" "$3" "$REF/tiny_flux.safetensors" <<'EOF'
import json, os, sys, time
d, key, label, src = sys.argv[1:5]
img = os.path.join(d, "image.arena")
with open(img, "rb") as f:
    f.seek(4088)
    hsum = f.read(8).hex()
st = os.stat(img)
doc = {"arena_cache": 1, "key": key, "label": label,
       "record": {"sources": [os.path.abspath(src)], "options": {"quant": "fp8-e4m3-row", "codec": None}},
       "image": {"file": "image.arena", "size": st.st_size, "mtime_ns": st.st_mtime_ns, "header_xxh3": hsum,
                 "verified": True},
       "made": time.time()}
with open(os.path.join(d, "entry.json"), "w") as f:
    json.dump(doc, f)
EOF
}

K1=0123456789abcdef0123456789abcdef
K2=fedcba9876543210fedcba9876543210

# hold FILE MODE: a process holding a flock on FILE (-s shared, -x
# exclusive) until it is killed; $HOLDER its pid, once it holds it.
hold() {
	(
		exec 9<>"$1"
		flock "$2" 9
		touch "$T/held"
		exec sleep 60
	) &
	HOLDER=$!
	i=0
	while ! [ -e "$T/held" ] && [ $i -lt 100 ]; do
		sleep 0.05
		i=$((i + 1))
	done
	rm -f "$T/held"
}

cache_list_verify_prune() {
	export ARENA_CACHE=$T/c
	cache_entry "$T/c" $K1 old-flux || fail "cannot make an entry"
	cache_entry "$T/c" $K2 new-flux || fail "cannot make an entry"
	touch -d '40 days ago' "$T/c/$K1/entry.json"
	echo "compiled" >"$T/c/$K2/beside.bin" # files beside the image count
	size2=$(($(stat -c %s "$T/c/$K2/image.arena") + $(stat -c %s "$T/c/$K2/entry.json") + 9))
	run cache list
	expect_rc 0
	[ "$(sed -n 1p "$T/out" | cut -c1-12)" = "${K2%????????????????????}" ] || fail "the most recently used is not first: $(cat "$T/out")"
	sed -n 2p "$T/out" | grep -q "^${K1%????????????????????}  .*used 40 days ago  *old-flux from .*/tiny_flux.safetensors quant=fp8-e4m3-row$" ||
		fail "the old entry's line: $(sed -n 2p "$T/out")"
	expect_out "2 entries, "
	expect_out " in $T/c"
	run cache list --json
	expect_rc 0
	python3 - "$T/out" "$size2" <<'EOF' || fail "list --json: $(cat "$T/out")"
import json, sys
d = json.load(open(sys.argv[1]))
e = d["entries"]
assert [x["label"] for x in e] == ["new-flux", "old-flux"], e
assert e[0]["size"] == int(sys.argv[2]), (e[0]["size"], sys.argv[2])
assert d["size"] == e[0]["size"] + e[1]["size"]
assert e[1]["record"]["options"]["quant"] == "fp8-e4m3-row" and e[1]["problem"] is None and e[1]["in_use"] is False
EOF
	run cache verify
	expect_rc 0
	expect_out "ok: ${K1%????????????????????}"
	expect_out "ok: ${K2%????????????????????}"
	run cache verify fedc
	expect_rc 0
	[ "$(wc -l <"$T/out")" = 1 ] || fail "verify fedc checked more than one entry: $(cat "$T/out")"
	run cache prune --older-than 30d --dry-run
	expect_rc 0
	expect_out "would remove: ${K1%????????????????????}"
	[ -d "$T/c/$K1" ] || fail "--dry-run removed an entry"
	run cache prune --older-than 30d
	expect_rc 0
	expect_out "removed: ${K1%????????????????????}"
	expect_out "freed "
	expect_out ": 1 entry"
	[ -d "$T/c/$K1" ] && fail "the entry unused for 40 days is still there"
	[ -e "$T/c/$K1.lock" ] && fail "its lock file is still there"
	[ -d "$T/c/$K2" ] || fail "the entry used now was removed"
	[ -f "$T/c/$K2/beside.bin" ] || fail "a file beside the image was removed"
	run cache prune --older-than 12h
	expect_rc 0
	expect_out "freed 0 B: 0 entries"
	run cache prune --all
	expect_rc 0
	expect_out "removed: ${K2%????????????????????}"
	[ -z "$(ls -A "$T/c")" ] || fail "prune --all left $(ls -A "$T/c")"
	run cache list
	expect_out "0 entries, 0 B in $T/c"
	# the package's own command is this one (python -m arena_gpu cache runs it)
	run cache --help
	expect_rc 0
	expect_out "usage: arena cache list"
}
cases cache_list_verify_prune

cache_bad_entries() {
	export ARENA_CACHE=$T/c
	cache_entry "$T/c" $K1 flux || fail "cannot make an entry"
	cache_entry "$T/c" $K2 flux2 || fail "cannot make an entry"
	# K1 truncated, K2 a data byte flipped (size and header as verified)
	size=$(stat -c %s "$T/c/$K1/image.arena")
	truncate -s $((size - 4096)) "$T/c/$K1/image.arena"
	at=$("$ARENA" inspect --json "$T/c/$K2/image.arena" | python3 -c 'import json, sys; print(json.load(sys.stdin)["layout"]["data_offset"] + 100)')
	python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)
    f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 1]))
' "$T/c/$K2/image.arena" "$at"
	run cache verify
	expect_rc 1
	expect_err "error: the cache entry $T/c/$K1 is bad: image.arena is $((size - 4096)) bytes, its record says $size"
	expect_err "error: the cache entry $T/c/$K2 is bad: "
	expect_err "checksum mismatch"
	expect_err "2 of 2 entries bad ('arena cache verify --remove' removes them)"
	[ -d "$T/c/$K1" ] && [ -d "$T/c/$K2" ] || fail "verify without --remove removed an entry"
	run cache verify --remove $K1
	expect_rc 1
	expect_out "removed: ${K1%????????????????????}"
	[ -e "$T/c/$K1" ] && fail "verify --remove left the bad entry"
	[ -d "$T/c/$K2" ] || fail "verify --remove K1 removed K2"
	# a record that is not JSON: listed as damaged, removed by verify --remove
	echo "{" >"$T/c/$K2/entry.json"
	run cache list
	expect_rc 0
	expect_out "damaged: its record entry.json is not JSON"
	run cache verify --remove
	expect_rc 1
	expect_out "removed: ${K2%????????????????????}"
	[ -z "$(ls -A "$T/c")" ] || fail "verify --remove left $(ls -A "$T/c")"
	run cache verify $K2
	expect_rc 2
	expect_err "verify: no entry $K2 in $T/c"
}
cases cache_bad_entries

cache_in_use_is_left() {
	export ARENA_CACHE=$T/c
	cache_entry "$T/c" $K1 flux || fail "cannot make an entry"
	touch -d '40 days ago' "$T/c/$K1/entry.json"
	# in use: a process holds the image (shared), as arena_gpu's CacheEntry does
	# (flock(1) takes it and ends: /proc/locks names a pid that is gone, so no pid is said)
	hold "$T/c/$K1/image.arena" -s
	run cache list
	expect_out "(in use)"
	run cache prune --older-than 30d
	expect_rc 0
	expect_out "left: ${K1%????????????????????}  in use"
	expect_out "freed 0 B: 0 entries; 1 left"
	[ -f "$T/c/$K1/image.arena" ] || fail "prune removed an entry in use"
	kill "$HOLDER"
	wait "$HOLDER" 2>/dev/null
	# being made: a process holds the key's lock, its pid written in it
	hold "$T/c/$K1.lock" -x
	echo "$HOLDER" >"$T/c/$K1.lock"
	run cache prune --all
	expect_rc 0
	expect_out "left: ${K1%????????????????????}  being made or checked by process $HOLDER"
	[ -f "$T/c/$K1/image.arena" ] || fail "prune removed an entry being made"
	# a folder being made is left too; one whose maker is gone is removed
	mkdir "$T/c/.tmp-$K1-1234"
	echo partial >"$T/c/.tmp-$K1-1234/image.arena"
	run cache prune --all
	[ -d "$T/c/.tmp-$K1-1234" ] || fail "prune removed a folder being made (its key's lock held)"
	kill "$HOLDER"
	wait "$HOLDER" 2>/dev/null
	run cache list
	expect_out "1 folder (8 B) of entries being made or removed"
	run cache prune --older-than 30d
	expect_rc 0
	expect_out "removed: $T/c/.tmp-$K1-1234  8 B (left by a process that stopped)"
	expect_out "removed: ${K1%????????????????????}"
	[ -z "$(ls -A "$T/c")" ] || fail "prune left $(ls -A "$T/c")"
	# a folder left without its lock file: removed, and the lock it took too
	mkdir "$T/c/.trash-$K2-77"
	run cache prune --all
	expect_out "removed: $T/c/.trash-$K2-77  0 B"
	[ -z "$(ls -A "$T/c")" ] || fail "prune left $(ls -A "$T/c")"
}
cases cache_in_use_is_left

cache_root_rules() {
	unset ARENA_CACHE XDG_CACHE_HOME
	export HOME=$T/home
	run cache list
	expect_rc 0
	expect_out "0 entries: the cache $T/home/.cache/arena does not exist yet"
	export XDG_CACHE_HOME=$T/xdg
	run cache list --json
	expect_rc 0
	expect_out "\"root\": \"$T/xdg/arena\""
	export XDG_CACHE_HOME=relative # not absolute: ignored, as the XDG rules say
	run cache list --json
	expect_out "\"root\": \"$T/home/.cache/arena\""
	export ARENA_CACHE=$T/c XDG_CACHE_HOME=$T/xdg
	run cache list --json
	expect_out "\"root\": \"$T/c\""
	run cache list --json --cache "$T/given"
	expect_out "\"root\": \"$T/given\""
	# a root other users can write, a symbolic link, another user's: refused
	mkdir -m 700 "$T/c"
	chmod 777 "$T/c"
	run cache list
	expect_rc 2
	expect_error_line
	expect_err "other users can write the cache folder $T/c (mode 777; it must be the user's alone): chmod go-w $T/c"
	run cache prune --all
	expect_rc 2
	chmod 700 "$T/c"
	ln -s "$T/c" "$T/link"
	export ARENA_CACHE=$T/link
	run cache verify
	expect_rc 2
	expect_err "the cache folder $T/link is a symbolic link"
	touch "$T/file"
	export ARENA_CACHE=$T/file
	run cache list
	expect_rc 2
	expect_err "the cache folder $T/file is not a folder"
}
cases cache_root_rules

cache_usage() {
	export ARENA_CACHE=$T/c
	run cache
	expect_rc 2
	expect_err "say list, verify or prune"
	run cache tidy
	expect_rc 2
	expect_err "'tidy' is not list, verify or prune"
	run cache prune
	expect_rc 2
	expect_err "prune: say which entries: --older-than DURATION (e.g. 30d) or --all"
	run cache prune --older-than 3x
	expect_rc 2
	expect_err "--older-than '3x' is not a duration"
	run cache prune --older-than 1d --all
	expect_rc 2
	run cache list --remove
	expect_rc 2
	expect_err "--remove is not an option of 'arena cache list'"
	run cache prune --json --all
	expect_rc 2
	run cache list extra
	expect_rc 2
	run cache verify --threads 0
	expect_rc 2
	run cache verify
	expect_rc 0
	expect_out "0 entries: the cache $T/c does not exist yet"
	[ -e "$T/c" ] && fail "a command that reads the cache made its folder"
	:
}
cases cache_usage
