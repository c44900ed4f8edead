/* replay.c - run a fuzz target over files without libFuzzer.
 *
 * usage: replay_<target> PATH...
 * Each PATH is a file or a folder (every regular file in it, not recursive).
 * Each file is read whole and passed to LLVMFuzzerTestOneInput. Prints
 * "replayed N inputs" and exits 0; a crash or sanitizer error fails it. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *fp = fopen(path, "rb");
	if (!fp) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len == cap) {
			cap = cap ? cap * 2 : 4096;
			uint8_t *nb = realloc(buf, cap);
			if (!nb) {
				fprintf(stderr, "replay: %s: out of memory\n", path);
				free(buf);
				fclose(fp);
				return -1;
			}
			buf = nb;
		}
		size_t r = fread(buf + len, 1, cap - len, fp);
		len += r;
		if (r == 0)
			break;
	}
	int err = ferror(fp);
	fclose(fp);
	if (err) {
		fprintf(stderr, "replay: %s: read error\n", path);
		free(buf);
		return -1;
	}
	/* An exact-size copy, so ASan catches reads past the input's end. */
	uint8_t *exact = malloc(len ? len : 1);
	if (!exact) {
		free(buf);
		return -1;
	}
	if (len)
		memcpy(exact, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(exact, len);
	free(exact);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file in dir, in name order; returns how many ran or -1. */
static long run_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	long rc = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			char **nn = realloc(names, cap * sizeof(*nn));
			if (!nn) {
				rc = -1;
				break;
			}
			names = nn;
		}
		size_t l = strlen(dir) + strlen(e->d_name) + 2;
		if (!(names[n] = malloc(l))) {
			rc = -1;
			break;
		}
		snprintf(names[n++], l, "%s/%s", dir, e->d_name);
	}
	closedir(d);
	if (names)
		qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		if (rc >= 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
			if (run_file(names[i]) < 0)
				rc = -1;
			else
				rc++;
		}
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	long total = 0;
	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|FOLDER...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		long n;
		if (S_ISDIR(st.st_mode)) {
			n = run_dir(argv[i]);
		} else {
			n = run_file(argv[i]) < 0 ? -1 : 1;
		}
		if (n < 0)
			return 1;
		total += n;
	}
	printf("replayed %ld inputs\n", total);
	return 0;
}
