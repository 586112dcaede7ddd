/*
 * A stub libnvidia-ml.so for tests: the NVML C functions the agent's adapter (remediator/adapters/nvml.py)
 * calls through pynvml, with GPU state read from a key=value file on every call.
 *
 * Where it sits: chaos tooling. The test suite builds it with gcc into a temporary directory and points
 * pynvml at it, so real return codes (GPU_IS_LOST, NOT_SUPPORTED, TIMEOUT, INSUFFICIENT_SIZE) and the struct
 * layouts pynvml defines (c_nvmlPciInfo_t, c_nvmlMemory_t, c_nvmlProcessInfo_v2_t, c_nvmlEventData_t) are
 * exercised through pynvml's own ctypes layer.
 *
 *   gcc -shared -fPIC -O1 -o libnvidia-ml.so.1 nvml_stub.c -lpthread
 *
 * State file: path in $NVML_STUB_STATE, one "key=value" per line, '#' starts a comment. Keys:
 *   init=<rc>                       return code of nvmlInit (default 0)
 *   count=<n>                       number of GPUs (at most 64)
 *   driver=<version>
 *   rc.<function>=<rc>              every GPU: that function returns <rc> (e.g. rc.nvmlEventSetWait_v2=999)
 *   gpu<i>.uuid / .name / .pci      identity; .pci as NVML prints it: 00000000:3B:00.0
 *   gpu<i>.lost=1                   every call on the GPU returns NVML_ERROR_GPU_IS_LOST (15)
 *   gpu<i>.rc.<function>=<rc>       that function returns <rc> for that GPU (3 = NOT_SUPPORTED, 10 = TIMEOUT)
 *   gpu<i>.mem_total / .mem_used    bytes (.mem_used as v1 counts it: allocated + reserved)
 *   gpu<i>.mem_reserved             bytes the driver reserves (nvmlDeviceGetMemoryInfo_v2; default 0)
 *   gpu<i>.ecc_sbe_volatile / .ecc_dbe_volatile / .ecc_sbe_aggregate / .ecc_dbe_aggregate
 *   gpu<i>.retired_sbe / .retired_dbe     number of retired pages by cause; .retired_pending=0|1
 *   gpu<i>.remap_correctable / .remap_uncorrectable / .remap_pending / .remap_failure
 *   gpu<i>.procs=<pid>:<bytes>,...  running compute processes
 *   gpu<i>.throttle=<bits>          clock-event reasons (decimal or 0x hex)
 *   gpu<i>.temp=<celsius>
 *   gpu<i>.events=<mask>            supported event types (default 0x8: Xid critical errors)
 *   gpu<i>.xids=<code>,<code>,...   Xid events delivered, in order, by nvmlEventSetWait_v2 (each once
 *                                   per process; append to the list to deliver more)
 *   gpu<i>.persistence=0|1          persistence mode (default 1, as under the GPU Operator's driver);
 *                                   nvmlDeviceSetPersistenceMode changes it for this process only
 * nvmlDeviceGetHandleByPciBusId_v2 finds a GPU by its .pci (case-insensitive, 4- or 8-digit domain).
 */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define MAX_GPUS 64
#define NVML_EVENT_XID 0x8ULL

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

struct stub_device {
    unsigned int index;
};
typedef struct stub_device *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

struct stub_event_set {
    unsigned long long mask[MAX_GPUS];
};
typedef struct stub_event_set *nvmlEventSet_t;

static struct stub_device g_devices[MAX_GPUS];
static int g_persistence[MAX_GPUS]; /* 0: as the state file says; 1: set off; 2: set on */
static int g_initialized = 0;
static unsigned int g_delivered[MAX_GPUS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* --- the state file ------------------------------------------------------------------------------ */

/* Copy the value of `key` into out; 1 when found. The file is read afresh on every call. */
static int stub_get(const char *key, char *out, size_t n) {
    const char *path = getenv("NVML_STUB_STATE");
    char line[4096];
    size_t klen = strlen(key);
    int found = 0;
    FILE *f;
    if (path == NULL || (f = fopen(path, "r")) == NULL) return 0;
    while (fgets(line, sizeof line, f) != NULL) {
        size_t len = strlen(line);
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (line[0] == '#') continue;
        if (strncmp(line, key, klen) == 0 && line[klen] == '=') {
            strncpy(out, line + klen + 1, n - 1);
            out[n - 1] = '\0';
            found = 1; /* the last assignment wins */
        }
    }
    fclose(f);
    return found;
}

static unsigned long long stub_u64(const char *key, unsigned long long dflt) {
    char buf[64];
    if (!stub_get(key, buf, sizeof buf)) return dflt;
    return strtoull(buf, NULL, 0);
}

static unsigned long long gpu_u64(unsigned int i, const char *field, unsigned long long dflt) {
    char key[160];
    snprintf(key, sizeof key, "gpu%u.%s", i, field);
    return stub_u64(key, dflt);
}

static int gpu_str(unsigned int i, const char *field, char *out, size_t n) {
    char key[160];
    snprintf(key, sizeof key, "gpu%u.%s", i, field);
    return stub_get(key, out, n);
}

static unsigned int gpu_count(void) {
    unsigned long long c = stub_u64("count", 0);
    return c > MAX_GPUS ? MAX_GPUS : (unsigned int)c;
}

/* Common checks of a device call: initialised, valid handle, lost GPU, per-function override. */
static nvmlReturn_t check(nvmlDevice_t dev, const char *function) {
    char key[160];
    unsigned long long rc;
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (dev == NULL || dev < g_devices || dev >= g_devices + MAX_GPUS || dev->index >= gpu_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_u64(dev->index, "lost", 0)) return NVML_ERROR_GPU_IS_LOST;
    snprintf(key, sizeof key, "gpu%u.rc.%s", dev->index, function);
    rc = stub_u64(key, 0);
    if (rc) return (nvmlReturn_t)rc;
    snprintf(key, sizeof key, "rc.%s", function);
    return (nvmlReturn_t)stub_u64(key, 0);
}

#define CHECK(dev)                                    \
    do {                                              \
        nvmlReturn_t rc_ = check((dev), __func__);    \
        if (rc_ != NVML_SUCCESS) return rc_;          \
    } while (0)

/* --- library ------------------------------------------------------------------------------------- */

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    nvmlReturn_t rc = (nvmlReturn_t)stub_u64("init", 0);
    (void)flags;
    if (rc != NVML_SUCCESS) return rc;
    for (unsigned int i = 0; i < MAX_GPUS; i++) g_devices[i].index = i;
    g_initialized++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    g_initialized--;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    char buf[80] = "550.54.15";
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    stub_get("driver", buf, sizeof buf);
    if (strlen(buf) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, buf);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpu_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_u64(index, "lost_handle", 0)) return NVML_ERROR_GPU_IS_LOST;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    CHECK(dev);
    *index = dev->index;
    return NVML_SUCCESS;
}

/* gpu<i>.minor (default: the index), as /dev/nvidia<minor> numbers the device */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    CHECK(dev);
    if (minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned int)gpu_u64(dev->index, "minor", dev->index);
    return NVML_SUCCESS;
}

/* --- identity ------------------------------------------------------------------------------------ */

static void stub_pci(unsigned int i, unsigned int *domain, unsigned int *bus, unsigned int *device,
                     unsigned int *function) {
    char buf[64];
    if (!gpu_str(i, "pci", buf, sizeof buf)) snprintf(buf, sizeof buf, "00000000:%02X:00.0", 0x10 + i);
    *domain = *bus = *device = *function = 0;
    sscanf(buf, "%x:%x:%x.%x", domain, bus, device, function);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    unsigned int d, b, v, f, wd = 0, wb = 0, wv = 0, wf = 0, i;
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (pciBusId == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &wd, &wb, &wv, &wf) != 4) return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < gpu_count(); i++) {
        stub_pci(i, &d, &b, &v, &f);
        if (d == wd && b == wb && v == wv && f == wf) {
            if (gpu_u64(i, "lost", 0) || gpu_u64(i, "lost_handle", 0)) return NVML_ERROR_GPU_IS_LOST;
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return 6; /* NVML_ERROR_NOT_FOUND */
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, int *mode) {
    CHECK(dev);
    if (mode == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    *mode = g_persistence[dev->index] ? g_persistence[dev->index] - 1
                                      : (int)gpu_u64(dev->index, "persistence", 1) != 0;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t dev, int mode) {
    CHECK(dev);
    if (mode != 0 && mode != 1) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    g_persistence[dev->index] = mode + 1;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    char buf[96];
    CHECK(dev);
    if (!gpu_str(dev->index, "uuid", buf, sizeof buf))
        snprintf(buf, sizeof buf, "GPU-00000000-0000-0000-0000-%012u", dev->index);
    if (strlen(buf) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(uuid, buf);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    char buf[96] = "NVIDIA H100 80GB HBM3";
    CHECK(dev);
    gpu_str(dev->index, "name", buf, sizeof buf);
    if (strlen(buf) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(name, buf);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    char buf[64];
    unsigned int domain = 0, bus = 0, device = 0, function = 0;
    CHECK(dev);
    if (!gpu_str(dev->index, "pci", buf, sizeof buf))
        snprintf(buf, sizeof buf, "00000000:%02X:00.0", 0x10 + dev->index);
    sscanf(buf, "%x:%x:%x.%x", &domain, &bus, &device, &function);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xFFFF, bus, device,
             function);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", domain, bus, device, function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    pci->pciDeviceId = (unsigned int)gpu_u64(dev->index, "pci_device_id", 0x233010DE);
    pci->pciSubSystemId = (unsigned int)gpu_u64(dev->index, "pci_subsystem_id", 0x16C110DE);
    return NVML_SUCCESS;
}

/* --- memory, ECC, retirement, remapping ---------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    CHECK(dev);
    memory->total = gpu_u64(dev->index, "mem_total", 85899345920ULL);
    memory->used = gpu_u64(dev->index, "mem_used", 0);
    memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory) {
    unsigned long long used;
    CHECK(dev);
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = gpu_u64(dev->index, "mem_total", 85899345920ULL);
    memory->reserved = gpu_u64(dev->index, "mem_reserved", 0);
    used = gpu_u64(dev->index, "mem_used", 0);
    memory->used = used > memory->reserved ? used - memory->reserved : 0;
    memory->free = memory->total > used ? memory->total - used : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int errorType, int counterType,
                                         unsigned long long *eccCounts) {
    static const char *fields[2][2] = {{"ecc_sbe_volatile", "ecc_sbe_aggregate"},
                                       {"ecc_dbe_volatile", "ecc_dbe_aggregate"}};
    CHECK(dev);
    if (errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1 || eccCounts == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eccCounts = gpu_u64(dev->index, fields[errorType][counterType], 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, int cause, unsigned int *pageCount,
                                       unsigned long long *addresses) {
    unsigned int n;
    CHECK(dev);
    if (pageCount == NULL || cause < 0 || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    n = (unsigned int)gpu_u64(dev->index, cause == 0 ? "retired_sbe" : "retired_dbe", 0);
    if (addresses == NULL || *pageCount < n) {
        *pageCount = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) addresses[i] = 0x100000ULL * (cause + 1) + 0x1000ULL * i;
    *pageCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, int *isPending) {
    CHECK(dev);
    *isPending = gpu_u64(dev->index, "retired_pending", 0) ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    CHECK(dev);
    *corrRows = (unsigned int)gpu_u64(dev->index, "remap_correctable", 0);
    *uncRows = (unsigned int)gpu_u64(dev->index, "remap_uncorrectable", 0);
    *isPending = gpu_u64(dev->index, "remap_pending", 0) ? 1 : 0;
    *failureOccurred = gpu_u64(dev->index, "remap_failure", 0) ? 1 : 0;
    return NVML_SUCCESS;
}

/* --- processes, clocks, temperature -------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    char buf[3072];
    unsigned int pids[256];
    unsigned long long used[256];
    unsigned int n = 0;
    CHECK(dev);
    if (infoCount == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_str(dev->index, "procs", buf, sizeof buf)) {
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok != NULL && n < 256; tok = strtok_r(NULL, ",", &save)) {
            char *colon = strchr(tok, ':');
            pids[n] = (unsigned int)strtoul(tok, NULL, 10);
            used[n] = colon ? strtoull(colon + 1, NULL, 0) : 0xFFFFFFFFFFFFFFFFULL;
            if (pids[n] != 0) n++;
        }
    }
    if (n == 0) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = used[i];
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    CHECK(dev);
    *reasons = gpu_u64(dev->index, "throttle", 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    CHECK(dev);
    *reasons = gpu_u64(dev->index, "throttle", 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp) {
    CHECK(dev);
    if (sensor != 0 || temp == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned int)gpu_u64(dev->index, "temp", 40);
    return NVML_SUCCESS;
}

/* --- events -------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *eventTypes) {
    CHECK(dev);
    *eventTypes = gpu_u64(dev->index, "events", NVML_EVENT_XID);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(struct stub_event_set));
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long eventTypes, nvmlEventSet_t set) {
    CHECK(dev);
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~gpu_u64(dev->index, "events", NVML_EVENT_XID)) return NVML_ERROR_NOT_SUPPORTED;
    set->mask[dev->index] |= eventTypes;
    return NVML_SUCCESS;
}

/* The next undelivered Xid of GPU i, or -1. */
static long long next_xid(unsigned int i) {
    char buf[3072];
    unsigned int k = 0;
    char *save = NULL;
    if (!gpu_str(i, "xids", buf, sizeof buf)) return -1;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (k++ == g_delivered[i]) {
            g_delivered[i]++;
            return strtoll(tok, NULL, 0);
        }
    }
    return -1;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec start, now;
    char key[64];
    unsigned long long rc;
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(key, sizeof key, "rc.%s", __func__);
    rc = stub_u64(key, 0);
    if (rc) return (nvmlReturn_t)rc;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        unsigned int count = gpu_count();
        pthread_mutex_lock(&g_lock);
        for (unsigned int i = 0; i < count; i++) {
            long long xid;
            if (!(set->mask[i] & NVML_EVENT_XID)) continue;
            xid = next_xid(i);
            if (xid >= 0) {
                pthread_mutex_unlock(&g_lock);
                data->device = &g_devices[i];
                data->eventType = NVML_EVENT_XID;
                data->eventData = (unsigned long long)xid;
                data->gpuInstanceId = 0xFFFFFFFFu;
                data->computeInstanceId = 0xFFFFFFFFu;
                return NVML_SUCCESS;
            }
        }
        pthread_mutex_unlock(&g_lock);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 >= (long)timeoutms)
            return NVML_ERROR_TIMEOUT;
        usleep(20000);
    }
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    free(set);
    return NVML_SUCCESS;
}
