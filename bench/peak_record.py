"""peak_record.py - one run's record for a JSON-lines file: a harness's JSON line and
bench/vram_peak.py's VRAM_PEAK line, from the run's standard output, joined.

usage: python3 bench/peak_record.py NAME RUN.OUT >> RECORDS.jsonl

Prints the run's record (its last line starting with "{") with "name": NAME and
"nvml": vram_peak.py's figures (null when the line is missing). Exit status 1,
printing nothing, when the run left no record (it failed: its stderr says why).
Used by bench/gpu_vram.sh and bench/gpu_pipeline.sh.
"""

import json
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    name, path = sys.argv[1], sys.argv[2]
    rec, peak = None, None
    for line in open(path):
        if line.startswith("VRAM_PEAK "):
            peak = json.loads(line[10:])
        elif line.startswith("{"):
            rec = json.loads(line)
    if rec is None:
        return 1
    rec["name"] = name
    rec["nvml"] = peak
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
