/* cmd_version.c - `arena version`: version and build features. */
#include <stdio.h>

#include "arena.h"
#include "cli.h"

const char cmd_version_usage[] =
	"usage: arena version\n"
	"\n"
	"Print arena's version and the features this build has (CUDA backend).\n";

int cmd_version(int argc, char **argv)
{
	(void)argv;
	if (argc > 1)
		return cli_usage_error("version", "takes no arguments");
	printf("arena %s\n", arena_version());
#ifdef ARENA_HAVE_CUDA
	printf("cuda backend: built\n");
#else
	printf("cuda backend: not built (no CUDA toolkit found at build time)\n");
#endif
	return 0;
}
