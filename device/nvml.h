/* nvml.h - the device memory this process holds as the NVIDIA driver counts
 * it (NVML's per-process figure: its CUDA context and loaded modules, and
 * every allocation of every library in it), for the cuda backend's proc_mem.
 *
 * NVML (libnvidia-ml.so.1) comes with the driver, not the toolkit: it is
 * loaded at run time with dlopen, so nothing links to it and a machine
 * without it (or a build without CUDA) simply gets NOT_FOUND.
 *
 * The process is found by its PID. In a container with a PID namespace of
 * its own the driver lists host PIDs, which do not match getpid(): then,
 * when the device lists exactly one compute process, that one is taken as
 * this one (how = ARENA_NVML_ONLY_PROCESS); with several, the figure is
 * unknown (NOT_FOUND). */
#ifndef ARENA_DEVICE_NVML_H
#define ARENA_DEVICE_NVML_H

#include <stdint.h>

enum {
	ARENA_NVML_PID = 1,          /* the process listed under this PID */
	ARENA_NVML_ONLY_PROCESS = 2, /* no PID matched; the device's only compute process */
};

/* The bytes the process holds on the device with PCI bus id `bus_id`
 * ("0000:3b:00.0", as cudaDeviceGetPCIBusId writes it) into *bytes, and how
 * it was found into *how (may be NULL): 0, or NOT_FOUND (no NVML, the
 * device not found, the process not listed, or its figure not available)
 * with a message saying which. Thread-safe; NVML is loaded once. */
int arena_nvml_process_used(const char *bus_id, uint64_t *bytes, int *how);

#endif
