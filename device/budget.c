/* budget.c - probing what may be pinned, and the ledger (see budget.h). */
#include "budget.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../common/err.h"
#include "backend.h"

static int read_text(const char *root, const char *path, char *buf, size_t len)
{
	char p[1024];
	snprintf(p, sizeof(p), "%s%s", root, path);
	FILE *f = fopen(p, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, len - 1, f);
	fclose(f);
	buf[n] = '\0';
	return 0;
}

static uint64_t mem_available(const char *root)
{
	char buf[8192];
	if (read_text(root, "/proc/meminfo", buf, sizeof(buf)))
		return UINT64_MAX;
	const char *p = strstr(buf, "MemAvailable:");
	unsigned long long kb;
	if (!p || sscanf(p, "MemAvailable: %llu kB", &kb) != 1)
		return UINT64_MAX;
	return (uint64_t)kb * 1024;
}

/* cgroup v2: the process's cgroup from /proc/self/cgroup ("0::/path"), then
 * memory.max - memory.current there and in every parent. */
static uint64_t cgroup_free(const char *root)
{
	char buf[4096], path[2048], v[64];
	if (read_text(root, "/proc/self/cgroup", buf, sizeof(buf)))
		return UINT64_MAX;
	char *line = strstr(buf, "0::");
	if (!line)
		return UINT64_MAX;
	line += 3;
	line[strcspn(line, "\n")] = '\0';
	snprintf(path, sizeof(path), "%s", line);
	uint64_t best = UINT64_MAX;
	for (;;) {
		char f[2300];
		unsigned long long max, cur;
		snprintf(f, sizeof(f), "/sys/fs/cgroup%s/memory.max", strcmp(path, "/") ? path : "");
		if (!read_text(root, f, v, sizeof(v)) && sscanf(v, "%llu", &max) == 1) {
			snprintf(f, sizeof(f), "/sys/fs/cgroup%s/memory.current", strcmp(path, "/") ? path : "");
			if (read_text(root, f, v, sizeof(v)) || sscanf(v, "%llu", &cur) != 1)
				cur = 0;
			uint64_t free_b = max > cur ? max - cur : 0;
			if (free_b < best)
				best = free_b;
		}
		char *slash = strrchr(path, '/');
		if (!slash || slash == path) {
			if (!strcmp(path, "/"))
				break;
			strcpy(path, "/");
			continue;
		}
		*slash = '\0';
	}
	return best;
}

/* CAP_IPC_LOCK (bit 14) in the effective set lifts RLIMIT_MEMLOCK. */
static int cap_ipc_lock(const char *root)
{
	char buf[4096];
	if (read_text(root, "/proc/self/status", buf, sizeof(buf)))
		return 0;
	const char *p = strstr(buf, "CapEff:");
	unsigned long long caps;
	return p && sscanf(p, "CapEff: %llx", &caps) == 1 && (caps >> 14 & 1);
}

int arena_pin_budget_probe(arena_pin_budget *b, uint64_t user_cap, uint64_t reserve, const char *root)
{
	memset(b, 0, sizeof(*b));
	atomic_init(&b->used, 0);
	if (!root)
		root = "";
	struct rlimit rl;
	b->memlock = UINT64_MAX;
	if (!*root && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && !cap_ipc_lock(root))
		b->memlock = (uint64_t)rl.rlim_cur;
	b->mem_available = mem_available(root);
	b->cgroup_free = cgroup_free(root);
	b->user_cap = user_cap ? user_cap : UINT64_MAX;
	uint64_t avail = b->mem_available < b->cgroup_free ? b->mem_available : b->cgroup_free;
	if (reserve == ARENA_PIN_RESERVE_AUTO) {
		uint64_t tenth = avail == UINT64_MAX ? 0 : avail / 10;
		reserve = tenth > (2ull << 30) ? tenth : (2ull << 30);
	}
	b->reserve = reserve;
	/* memlock is a hard limit of its own; the memory sources lose the reserve. */
	uint64_t lim = avail == UINT64_MAX ? UINT64_MAX : (avail > reserve ? avail - reserve : 0);
	strcpy(b->bound_by, b->mem_available <= b->cgroup_free ? "MemAvailable" : "cgroup memory.max");
	if (b->memlock < lim) {
		lim = b->memlock;
		strcpy(b->bound_by, "RLIMIT_MEMLOCK");
	}
	if (b->user_cap < lim) {
		lim = b->user_cap;
		strcpy(b->bound_by, "user cap");
	}
	if (lim == UINT64_MAX)
		strcpy(b->bound_by, "none");
	b->limit = lim;
	return 0;
}

int arena_pin_budget_take(arena_pin_budget *b, uint64_t bytes)
{
	uint64_t cur = atomic_load(&b->used);
	do {
		if (bytes > b->limit || cur > b->limit - bytes)
			return arena_errorf(ARENA_E(BUDGET),
					    "pinning %" PRIu64 " more bytes would exceed the pinned budget (%" PRIu64
					    " of %" PRIu64 " used, bound by %s)",
					    bytes, cur, b->limit, b->bound_by);
	} while (!atomic_compare_exchange_weak(&b->used, &cur, cur + bytes));
	if (cur + bytes > b->peak)
		b->peak = cur + bytes;
	return 0;
}

void arena_pin_budget_give(arena_pin_budget *b, uint64_t bytes)
{
	uint64_t prev = atomic_fetch_sub(&b->used, bytes);
	if (prev < bytes)
		ARENA_BUG("pinned budget: gave back more than was taken");
}

int arena_pin_budget_register(arena_pin_budget *b, arena_backend *be, void *p, uint64_t bytes)
{
	if (!b || arena_pin_budget_take(b, bytes)) {
		arena_error_clear();
		return 0;
	}
	if (be->ops->host_register(be, p, bytes)) {
		arena_pin_budget_give(b, bytes);
		arena_error_clear();
		return 0;
	}
	return 1;
}

void arena_pin_budget_unregister(arena_pin_budget *b, arena_backend *be, void *p, uint64_t bytes)
{
	be->ops->host_unregister(be, p);
	arena_pin_budget_give(b, bytes);
}
