/* nvml.c - the process's device memory from NVML, loaded at run time. */
#include "nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "../common/err.h"

/* NVML's ABI, as its header declares it (stable since NVML 11): the
 * handful of calls used here. */
typedef int nvml_ret;
typedef void *nvml_device;
typedef struct nvml_proc {
	unsigned int pid;
	unsigned long long used; /* usedGpuMemory */
	unsigned int gpu_instance, compute_instance;
} nvml_proc;
typedef struct nvml_proc_v1 {
	unsigned int pid;
	unsigned long long used;
} nvml_proc_v1;
#define NVML_OK 0
#define NVML_INSUFFICIENT_SIZE 7
#define NVML_NOT_AVAILABLE (~0ull) /* NVML_VALUE_NOT_AVAILABLE */
#define NVML_MAX_PROCS 256

static struct {
	pthread_once_t once;
	int ok;
	char why[160];
	pthread_mutex_t mu; /* NVML is thread-safe; this guards nothing but the lookups below */
	nvml_ret (*by_bus)(const char *, nvml_device *);
	nvml_ret (*procs)(nvml_device, unsigned int *, nvml_proc *);       /* _v3 or _v2 */
	nvml_ret (*procs_v1)(nvml_device, unsigned int *, nvml_proc_v1 *); /* the oldest drivers */
	const char *(*str)(nvml_ret);
} nv = {PTHREAD_ONCE_INIT, 0, "", PTHREAD_MUTEX_INITIALIZER, NULL, NULL, NULL, NULL};

static void nvml_load(void)
{
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(nv.why, sizeof(nv.why), "NVML is not installed (libnvidia-ml.so.1: %s)", dlerror());
		return;
	}
	nvml_ret (*init)(void) = (nvml_ret(*)(void))dlsym(h, "nvmlInit_v2");
	*(void **)&nv.by_bus = dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
	*(void **)&nv.procs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (!nv.procs)
		*(void **)&nv.procs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v2");
	if (!nv.procs)
		*(void **)&nv.procs_v1 = dlsym(h, "nvmlDeviceGetComputeRunningProcesses");
	*(void **)&nv.str = dlsym(h, "nvmlErrorString");
	if (!init || !nv.by_bus || !(nv.procs || nv.procs_v1)) {
		snprintf(nv.why, sizeof(nv.why), "NVML lacks the calls needed (a driver older than 450?)");
		return;
	}
	nvml_ret r = init();
	if (r != NVML_OK) {
		snprintf(nv.why, sizeof(nv.why), "nvmlInit: %s", nv.str ? nv.str(r) : "failed");
		return;
	}
	nv.ok = 1; /* the library stays loaded and initialized for the process's life */
}

int arena_nvml_process_used(const char *bus_id, uint64_t *bytes, int *how)
{
	*bytes = 0;
	if (how)
		*how = 0;
	pthread_once(&nv.once, nvml_load);
	if (!nv.ok)
		return arena_errorf(ARENA_E_NOT_FOUND, "nvml: %s", nv.why);
	nvml_device d;
	nvml_ret r = nv.by_bus(bus_id, &d);
	if (r != NVML_OK)
		return arena_errorf(ARENA_E_NOT_FOUND, "nvml: device %s: %s", bus_id, nv.str ? nv.str(r) : "not found");
	static nvml_proc p[NVML_MAX_PROCS];
	static nvml_proc_v1 p1[NVML_MAX_PROCS];
	pthread_mutex_lock(&nv.mu);
	unsigned int n = NVML_MAX_PROCS;
	if (nv.procs) {
		r = nv.procs(d, &n, p);
	} else {
		r = nv.procs_v1(d, &n, p1);
		for (unsigned int i = 0; r == NVML_OK && i < n; i++)
			p[i] = (nvml_proc){p1[i].pid, p1[i].used, 0, 0};
	}
	int rc = 0;
	unsigned long long got = NVML_NOT_AVAILABLE;
	int found = 0;
	if (r != NVML_OK) {
		rc = arena_errorf(ARENA_E_NOT_FOUND, "nvml: the processes on %s: %s", bus_id,
				  r == NVML_INSUFFICIENT_SIZE ? "more than 256" : nv.str ? nv.str(r) : "failed");
	} else {
		unsigned int self = (unsigned int)getpid();
		for (unsigned int i = 0; i < n; i++)
			if (p[i].pid == self) {
				got = p[i].used;
				found = ARENA_NVML_PID;
			}
		if (!found && n == 1) {
			got = p[0].used;
			found = ARENA_NVML_ONLY_PROCESS;
		}
		if (!found)
			rc = arena_errorf(ARENA_E_NOT_FOUND, "nvml: process %u is not among the %u on %s", self, n, bus_id);
		else if (got == NVML_NOT_AVAILABLE)
			rc = arena_errorf(ARENA_E_NOT_FOUND, "nvml: the driver does not say what process %u holds on %s",
					  self, bus_id);
	}
	pthread_mutex_unlock(&nv.mu);
	if (!rc) {
		*bytes = got;
		if (how)
			*how = found;
	}
	return rc;
}
