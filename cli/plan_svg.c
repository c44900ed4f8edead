/* plan_svg.c - `arena plan --svg`: the plan as a picture (plan_svg.h). */
#include "plan_svg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/outfile.h"
#include "../common/units.h"
#include "cli.h"

#define W 1000.0
#define X0 20.0
#define XW 960.0 /* the strip's and the memory bar's width */
#define TX0 90.0 /* the time lanes leave room for their names */
#define TXW 890.0

#define C_GLOBALS "#78909c"
#define C_RESIDENT "#2e7d32"
#define C_STREAMED "#ef6c00"
#define C_SLOT "#ffb74d"
#define C_FREE "#eceff1"
#define C_RESERVE "#90caf9"
#define C_HEADROOM "#cfd8dc"

typedef struct sb {
	char *p;
	size_t n, cap;
	int oom;
} sb;

static void sb_printf(sb *b, const char *fmt, ...) ARENA_PRINTF(2, 3);
static void sb_printf(sb *b, const char *fmt, ...)
{
	if (b->oom)
		return;
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
		va_end(ap);
		if (k < 0) {
			b->oom = 1;
			return;
		}
		if (b->p && (size_t)k < b->cap - b->n) {
			b->n += (size_t)k;
			return;
		}
		size_t cap = b->cap ? b->cap : 16384;
		while (cap - b->n <= (size_t)k)
			cap *= 2;
		char *q = arena_realloc(b->p, cap);
		if (!q) {
			b->oom = 1;
			return;
		}
		b->p = q;
		b->cap = cap;
	}
}

/* s as XML text (also inside attribute values). */
static void sb_xml(sb *b, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&':
			sb_printf(b, "&amp;");
			break;
		case '<':
			sb_printf(b, "&lt;");
			break;
		case '>':
			sb_printf(b, "&gt;");
			break;
		case '"':
			sb_printf(b, "&quot;");
			break;
		case '\'':
			sb_printf(b, "&apos;");
			break;
		default:
			if ((unsigned char)*s >= 0x20)
				sb_printf(b, "%c", *s);
		}
	}
}

static const char *fmtb(uint64_t n, char *buf, size_t len)
{
	return arena_size_str(n, buf, len);
}

static const char *where(const plan_svg_in *in, uint32_t b)
{
	return arena_block_is_globals(in->l, b) ? "globals" : in->p->resident[b] ? "resident" : "streamed";
}

static const char *color(const char *w)
{
	return !strcmp(w, "globals") ? C_GLOBALS : !strcmp(w, "resident") ? C_RESIDENT : C_STREAMED;
}

static void text(sb *b, double x, double y, int size, const char *anchor, const char *extra, const char *s)
{
	sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"%s\"%s>", x, y, size, anchor, extra);
	sb_xml(b, s);
	sb_printf(b, "</text>\n");
}

/* A rect of memory [a, z) bytes of `total` along the bar at y. */
static void mem_rect(sb *b, double y, double h, uint64_t a, uint64_t z, uint64_t total, const char *cls,
		     const char *fill, const char *title)
{
	if (z <= a)
		return;
	double x = X0 + XW * (double)a / (double)total, w = XW * (double)(z - a) / (double)total;
	sb_printf(b, "<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"#fff\" stroke-width=\"0.5\"><title>",
		  cls, x, y, w, h, fill);
	sb_xml(b, title);
	sb_printf(b, "</title></rect>\n");
}

static void blocks_strip(sb *b, const plan_svg_in *in, double y)
{
	const arena_layout *l = in->l;
	size_t n = l->n_blocks;
	uint64_t total = 0, by[3] = {0};
	size_t cnt[3] = {0};
	for (size_t i = 0; i < n; i++)
		total += l->blocks[i].bytes;
	double unit = n && (double)n < XW / 2 ? 1.0 : XW / (2.0 * (double)(n ? n : 1));
	double rest = XW - unit * (double)n, x = X0, label_end = -1;
	text(b, X0, y - 8, 12, "start", " font-weight=\"bold\"", "blocks in execution order, as wide as their bytes");
	for (uint32_t i = 0; i < n; i++) {
		const arena_block *blk = &l->blocks[i];
		const char *w = where(in, i);
		int k = !strcmp(w, "globals") ? 0 : !strcmp(w, "resident") ? 1 : 2;
		by[k] += blk->bytes;
		cnt[k]++;
		double wd = unit + (total ? rest * (double)blk->bytes / (double)total : 0);
		char sz[32];
		sb_printf(b, "<rect class=\"block %s\" data-block=\"", w);
		sb_xml(b, blk->name);
		sb_printf(b, "\" data-index=\"%u\" data-bytes=\"%llu\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"36\" fill=\"%s\" stroke=\"#fff\" stroke-width=\"%.2f\"><title>",
			  i, (unsigned long long)blk->bytes, x, y, wd, color(w), unit < 1 ? 0.0 : 0.5);
		sb_xml(b, blk->name);
		sb_printf(b, ": %s, %s</title></rect>\n", fmtb(blk->bytes, sz, sizeof(sz)), w);
		/* The container's name where it starts (if there is room). */
		const char *c = blk->container ? blk->container : "globals";
		const char *pc = i ? (l->blocks[i - 1].container ? l->blocks[i - 1].container : "globals") : NULL;
		if ((!pc || strcmp(c, pc)) && x >= label_end) {
			sb_printf(b, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#555\"/>\n", x, y + 36, x, y + 44);
			text(b, x + 2, y + 54, 10, "start", "", c);
			label_end = x + 6.0 * (double)strlen(c) + 12;
		}
		x += wd;
	}
	/* legend */
	static const char *const names[3] = {"globals", "resident", "streamed"};
	double lx = X0;
	for (int k = 0; k < 3; k++) {
		char sz[32], s[96];
		snprintf(s, sizeof(s), "%s: %zu block%s, %s", names[k], cnt[k], cli_s(cnt[k]),
			 fmtb(by[k], sz, sizeof(sz)));
		sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/>\n", lx, y + 64, color(names[k]));
		text(b, lx + 14, y + 73, 11, "start", "", s);
		lx += 240;
	}
}

static void memory_bar(sb *b, const plan_svg_in *in, double y)
{
	const arena_residency_plan *p = in->p;
	uint64_t total = in->vram ? in->vram : 1, at = 0;
	uint64_t ring = p->n_streamed ? (uint64_t)p->slots * p->slot_bytes : 0;
	char s1[32], s2[32], s3[32], t[160];
	snprintf(t, sizeof(t), "device memory: %s (weights budget %s)", fmtb(in->vram, s1, sizeof(s1)),
		 fmtb(in->budget, s2, sizeof(s2)));
	text(b, X0, y - 8, 12, "start", " font-weight=\"bold\"", t);
	snprintf(t, sizeof(t), "globals %s", fmtb(p->globals_bytes, s1, sizeof(s1)));
	mem_rect(b, y, 24, at, at + p->globals_bytes, total, "mem globals", C_GLOBALS, t);
	at += p->globals_bytes;
	uint64_t res = p->resident_bytes - p->globals_bytes;
	snprintf(t, sizeof(t), "resident blocks %s", fmtb(res, s1, sizeof(s1)));
	mem_rect(b, y, 24, at, at + res, total, "mem resident", C_RESIDENT, t);
	at += res;
	for (unsigned k = 0; ring && k < p->slots; k++) {
		snprintf(t, sizeof(t), "ring slot %u of %u: %s", k + 1, p->slots, fmtb(p->slot_bytes, s1, sizeof(s1)));
		mem_rect(b, y, 24, at, at + p->slot_bytes, total, "slot", C_SLOT, t);
		at += p->slot_bytes;
	}
	uint64_t left = in->budget > at ? in->budget - at : 0;
	snprintf(t, sizeof(t), "weights budget left %s", fmtb(left, s1, sizeof(s1)));
	mem_rect(b, y, 24, at, at + left, total, "mem free", C_FREE, t);
	at += left;
	snprintf(t, sizeof(t), "working reserve %s", fmtb(in->reserve, s1, sizeof(s1)));
	mem_rect(b, y, 24, at, at + in->reserve, total, "mem reserve", C_RESERVE, t);
	at += in->reserve;
	snprintf(t, sizeof(t), "headroom %s", fmtb(in->headroom, s1, sizeof(s1)));
	mem_rect(b, y, 24, at, at + in->headroom, total, "mem headroom", C_HEADROOM, t);
	if (ring)
		snprintf(t, sizeof(t), "the ring: %u slot%s x %s = %s, streamed per step %s in %llu cop%s", p->slots,
			 cli_s(p->slots), fmtb(p->slot_bytes, s1, sizeof(s1)), fmtb(ring, s2, sizeof(s2)),
			 fmtb(p->stream_bytes_per_step, s3, sizeof(s3)), (unsigned long long)p->copies_per_step,
			 p->copies_per_step == 1 ? "y" : "ies");
	else
		snprintf(t, sizeof(t), "no ring: everything is resident");
	text(b, X0, y + 40, 11, "start", "", t);
	text(b, X0 + XW, y + 40, 11, "end", " fill=\"#555\"", "(globals, resident, ring slots, budget left, reserve, headroom)");
}

/* One steady step as the planner predicts it: copies and compute in time. */
static int timeline(sb *b, const plan_svg_in *in, double y)
{
	arena_plan_span *sp;
	size_t n;
	double step;
	int rc = arena_residency_plan_timeline(in->l, in->o, in->p, &sp, &n, &step);
	if (rc)
		return rc;
	double comp = 0, copy = 0;
	for (size_t i = 0; i < n; i++)
		*(sp[i].copy ? &copy : &comp) += sp[i].t1 - sp[i].t0;
	char t[256];
	double r = in->o->h2d_bytes_per_s;
	snprintf(t, sizeof(t), "one step, predicted by the profile %s: %.2f ms (compute %.2f ms, copies %.2f ms at %.3g %s)",
		 !in->profile ? "" : strrchr(in->profile, '/') ? strrchr(in->profile, '/') + 1 : in->profile, step * 1e3, comp * 1e3, copy * 1e3, r >= 1e9 ? r / 1e9 : r / 1e6,
		 r >= 1e9 ? "GB/s" : "MB/s");
	text(b, X0, y - 8, 12, "start", " font-weight=\"bold\"", t);
	text(b, TX0 - 8, y + 14, 11, "end", "", "copies");
	text(b, TX0 - 8, y + 40, 11, "end", "", "compute");
	sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"20\" fill=\"%s\"/>\n", TX0, y, TXW, C_FREE);
	sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"20\" fill=\"%s\"/>\n", TX0, y + 26, TXW, C_FREE);
	double scale = step > 0 ? TXW / step : 0;
	for (size_t i = 0; i < n; i++) {
		const arena_plan_span *s = &sp[i];
		const char *w = where(in, s->block);
		double x = TX0 + s->t0 * scale, wd = (s->t1 - s->t0) * scale;
		sb_printf(b, "<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"20\" fill=\"%s\" stroke=\"#fff\" stroke-width=\"0.3\"><title>",
			  s->copy ? "copy" : !strcmp(w, "streamed") ? "compute streamed" : "compute resident", x,
			  s->copy ? y : y + 26, wd > 0 ? wd : 0, s->copy ? C_STREAMED : color(w));
		sb_printf(b, "%s", s->copy ? "copy of " : s->bwd ? "backward of " : "");
		sb_xml(b, in->l->blocks[s->block].name);
		sb_printf(b, ": %.3f..%.3f ms</title></rect>\n", s->t0 * 1e3, s->t1 * 1e3);
	}
	/* a time axis in ms, about 10 ticks */
	double ms = step * 1e3, tick = 1e-3; /* 1, 2, 5 x 10^k: the first with at most 10 ticks */
	for (int k = 0; ms / tick > 10 && k < 60; k++)
		tick *= k % 3 == 1 ? 2.5 : 2;
	for (double v = 0; v <= ms + 1e-9 && tick > 0; v += tick) {
		double x = TX0 + v / 1e3 * scale;
		char s[32];
		snprintf(s, sizeof(s), "%g", v);
		sb_printf(b, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#555\"/>\n", x, y + 48, x, y + 53);
		text(b, x, y + 64, 10, "middle", "", s);
	}
	text(b, TX0 + TXW, y + 78, 10, "end", " fill=\"#555\"",
	     "ms; gaps in the compute lane: the step waits for a copy (a stall)");
	arena_free(sp);
	return 0;
}

int plan_svg_write(const char *path, const plan_svg_in *in)
{
	int rc = arena_outfile_check_input(path, in->image_fd, in->image);
	if (rc)
		return rc;
	int prof = in->o->cost && in->o->h2d_bytes_per_s > 0;
	double h = prof ? 372 : 262;
	sb b = {0};
	sb_printf(&b,
		  "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
		  "font-family=\"sans-serif\">\n"
		  "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
		  W, h, W, h);
	const arena_residency_plan *p = in->p;
	char s1[32], s2[32], t[512];
	const char *base = strrchr(in->image, '/') ? strrchr(in->image, '/') + 1 : in->image;
	snprintf(t, sizeof(t), "arena plan %s, %s, %s of device memory", base,
		 in->o->mode == ARENA_MODE_TRAIN ? "train" : "sample", fmtb(in->vram, s1, sizeof(s1)));
	text(&b, X0, 24, 16, "start", " font-weight=\"bold\"", t);
	snprintf(t, sizeof(t), "%zu of %zu block%s resident (%s with globals), %zu streamed (%s)", p->n_resident,
		 p->n_resident + p->n_streamed, cli_s(p->n_resident + p->n_streamed), fmtb(p->resident_bytes, s1, sizeof(s1)),
		 p->n_streamed,
		 fmtb(p->streamed_block_bytes, s2, sizeof(s2)));
	text(&b, X0, 42, 12, "start", " fill=\"#333\"", t);
	blocks_strip(&b, in, 78);
	memory_bar(&b, in, 196);
	if (prof && (rc = timeline(&b, in, 290))) {
		arena_free(b.p);
		return rc;
	}
	sb_printf(&b, "</svg>\n");
	if (b.oom) {
		arena_free(b.p);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	}
	arena_outfile *f = NULL;
	if (!(rc = arena_outfile_open(path, &f)) && !(rc = arena_outfile_write(f, b.p, b.n))) {
		rc = arena_outfile_commit(f);
		f = NULL;
	}
	arena_outfile_abort(f);
	arena_free(b.p);
	return rc;
}
