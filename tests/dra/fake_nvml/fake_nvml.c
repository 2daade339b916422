/* A fake libnvidia-ml.so.1 for tests on machines without an NVIDIA GPU: only
 * the NVML functions toposerve's GPU driver calls, with NVML's signatures,
 * struct layouts and return codes, answering from a scenario file named by
 * $TOPOSERVE_FAKE_NVML (read at every nvmlInit).
 *
 * Scenario: one "key value" a line; "gpu" starts a GPU, keys after it are
 * that GPU's; "profile <id> <name> <slices> <instances> <sms> <memoryMB>
 * <remaining> <start,start,...>" adds a GPU instance profile to it.
 * At run time (read on every call that needs them):
 *   <scenario>.lost  GPU indices, one a line, whose calls return GPU_IS_LOST;
 *   <scenario>.xid   "<gpu index> <xid>" lines, each delivered once by
 *                    nvmlEventSetWait_v2 as a critical XID event;
 *   <scenario>.fabric "<gpu index> <state> <status>" lines: that GPU's fabric
 *                    registration now (NVML_GPU_FABRIC_STATE_*, an nvmlReturn_t),
 *                    over its scenario's fabric_state (the last line wins).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum { OK = 0, E_UNINIT = 1, E_INVALID = 2, E_NOT_SUPPORTED = 3, E_NOT_FOUND = 6,
       E_SIZE = 7, E_DRIVER = 9, E_TIMEOUT = 10, E_LOST = 15 };
#define XID_CRITICAL 0x8ULL
#define MAX_GPUS 16
#define MAX_PROFILES 20
#define MAX_PLACEMENTS 8

typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;

struct profile {
    unsigned int id, slices, instances, sms, remaining, nplacements;
    unsigned long long memory_mb;
    unsigned int placements[MAX_PLACEMENTS];
    char name[64];
};
struct gpu {
    int index;
    char uuid[96], name[96], bus_id[32];
    unsigned long long memory;
    unsigned int arch, minor, brand, device_id, pci_sub;
    int cc_major, cc_minor;
    int mig_capable, mig_mode;
    int has_fabric;
    unsigned char fabric_uuid[16];
    unsigned int fabric_clique, fabric_state;
    int nprofiles;
    struct profile profiles[MAX_PROFILES];
};
typedef struct gpu *nvmlDevice_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct event_set { unsigned long long mask[MAX_GPUS]; };
typedef struct event_set *nvmlEventSet_t;

static struct gpu gpus[MAX_GPUS];
static int ngpus, initialized;
static char driver_version[80];
static int cuda_version;
static char scenario[4096];
static long xid_offset;  /* bytes of <scenario>.xid already delivered */

static void hex_uuid(const char *s, unsigned char out[16]) {
    int n = 0;
    for (; *s && n < 32; s++) {
        unsigned int v;
        char c[2] = {*s, 0};
        if (*s == '-' || sscanf(c, "%1x", &v) != 1) continue;
        out[n / 2] = (unsigned char)(n % 2 ? out[n / 2] | v : v << 4);
        n++;
    }
}

static int load(void) {
    FILE *f = fopen(scenario, "r");
    char line[1024];
    struct gpu *g = NULL;
    if (!f) return -1;
    memset(gpus, 0, sizeof gpus);
    ngpus = 0;
    while (fgets(line, sizeof line, f)) {
        char key[64], rest[960] = "";
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "%63s %959[^\n]", key, rest) < 1 || key[0] == '#') continue;
        if (!strcmp(key, "gpu")) {
            if (ngpus == MAX_GPUS) break;
            g = &gpus[ngpus];
            g->index = ngpus++;
            g->arch = 0xffffffff;
            continue;
        }
        if (!strcmp(key, "driver_version")) snprintf(driver_version, sizeof driver_version, "%s", rest);
        else if (!strcmp(key, "cuda_version")) cuda_version = atoi(rest);
        else if (!g) continue;
        else if (!strcmp(key, "uuid")) snprintf(g->uuid, sizeof g->uuid, "%s", rest);
        else if (!strcmp(key, "name")) snprintf(g->name, sizeof g->name, "%s", rest);
        else if (!strcmp(key, "bus_id")) snprintf(g->bus_id, sizeof g->bus_id, "%s", rest);
        else if (!strcmp(key, "memory")) g->memory = strtoull(rest, NULL, 10);
        else if (!strcmp(key, "arch")) g->arch = (unsigned int)atoi(rest);
        else if (!strcmp(key, "minor")) g->minor = (unsigned int)atoi(rest);
        else if (!strcmp(key, "brand")) g->brand = (unsigned int)atoi(rest);
        else if (!strcmp(key, "pci_device_id")) g->device_id = (unsigned int)strtoul(rest, NULL, 16);
        else if (!strcmp(key, "cc")) sscanf(rest, "%d.%d", &g->cc_major, &g->cc_minor);
        else if (!strcmp(key, "mig_mode")) { g->mig_capable = 1; g->mig_mode = atoi(rest); }
        else if (!strcmp(key, "fabric_cluster")) { g->has_fabric = 1; hex_uuid(rest, g->fabric_uuid); }
        else if (!strcmp(key, "fabric_clique")) g->fabric_clique = (unsigned int)atoi(rest);
        else if (!strcmp(key, "fabric_state")) g->fabric_state = (unsigned int)atoi(rest);
        else if (!strcmp(key, "profile") && g->nprofiles < MAX_PROFILES) {
            struct profile *p = &g->profiles[g->nprofiles];
            char starts[256] = "", *tok;
            if (sscanf(rest, "%u %63s %u %u %u %llu %u %255s", &p->id, p->name, &p->slices,
                       &p->instances, &p->sms, &p->memory_mb, &p->remaining, starts) != 8)
                continue;
            for (tok = strtok(starts, ","); tok && p->nplacements < MAX_PLACEMENTS;
                 tok = strtok(NULL, ","))
                p->placements[p->nplacements++] = (unsigned int)atoi(tok);
            g->nprofiles++;
        }
    }
    fclose(f);
    return 0;
}

static int lost(const struct gpu *g) {
    char path[4200], line[64];
    FILE *f;
    int found = 0;
    snprintf(path, sizeof path, "%s.lost", scenario);
    if (!(f = fopen(path, "r"))) return 0;
    while (!found && fgets(line, sizeof line, f)) found = atoi(line) == g->index && line[0] != '\n';
    fclose(f);
    return found;
}

/* The common checks of a device call: initialized, a handle of ours, not lost. */
static nvmlReturn_t check(nvmlDevice_t d) {
    if (!initialized) return E_UNINIT;
    if (d < gpus || d >= gpus + ngpus) return E_INVALID;
    return lost(d) ? E_LOST : OK;
}
#define CHECK(d, ...) do { nvmlReturn_t r_ = check(d); if (r_) return r_; \
    if (__VA_ARGS__) return E_INVALID; } while (0)

static nvmlReturn_t copy_str(char *out, unsigned int len, const char *s) {
    if (strlen(s) + 1 > len) return E_SIZE;
    strcpy(out, s);
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    const char *s = getenv("TOPOSERVE_FAKE_NVML");
    (void)flags;
    if (!s || snprintf(scenario, sizeof scenario, "%s", s) >= (int)sizeof scenario || load())
        return E_DRIVER;  /* as when the kernel driver is not loaded */
    xid_offset = 0;
    initialized = 1;
    return OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return E_UNINIT;
    initialized = 0;
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_INVALID: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_NOT_FOUND: return "Not Found";
    case E_SIZE: return "Insufficient Size";
    case E_DRIVER: return "Driver Not Loaded";
    case E_TIMEOUT: return "Timeout";
    case E_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len) {
    if (!initialized) return E_UNINIT;
    return copy_str(version, len, driver_version);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return E_INVALID;
    *v = cuda_version;
    return OK;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!initialized) return E_UNINIT;
    if (!n) return E_INVALID;
    *n = (unsigned int)ngpus;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!initialized) return E_UNINIT;
    if (!d || i >= (unsigned int)ngpus) return E_INVALID;
    *d = &gpus[i];
    return lost(*d) ? E_LOST : OK;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned int len) {
    CHECK(d, !out);
    return copy_str(out, len, d->uuid);
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *out, unsigned int len) {
    CHECK(d, !out);
    return copy_str(out, len, d->name);
}
nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, unsigned int *b) {
    CHECK(d, !b);
    *b = d->brand;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    CHECK(d, !m);
    m->total = d->memory;
    m->used = 0;
    m->free = d->memory;
    return OK;
}
nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *a) {
    CHECK(d, !a);
    *a = d->arch;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    CHECK(d, !major || !minor);
    *major = d->cc_major;
    *minor = d->cc_minor;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    CHECK(d, !p);
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", d->bus_id);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", d->bus_id + 4);
    sscanf(d->bus_id, "%x:%x:%x", &p->domain, &p->bus, &p->device);
    p->pciDeviceId = d->device_id << 16 | 0x10de;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) {
    CHECK(d, !m);
    *m = d->minor;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending) {
    CHECK(d, !cur || !pending);
    if (!d->mig_capable) return E_NOT_SUPPORTED;
    *cur = *pending = (unsigned int)d->mig_mode;
    return OK;
}
static struct profile *find_profile(nvmlDevice_t d, unsigned int id) {
    for (int i = 0; i < d->nprofiles; i++)
        if (d->profiles[i].id == id) return &d->profiles[i];
    return NULL;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int id,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    struct profile *p;
    CHECK(d, !info || id >= 0x12);
    if (!d->mig_capable || !(p = find_profile(d, id))) return E_NOT_SUPPORTED;
    memset(&info->id, 0, sizeof *info - sizeof info->version);
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sms;
    info->memorySizeMB = p->memory_mb;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int id,
        nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    struct profile *p;
    CHECK(d, !count);
    if (!d->mig_capable || !(p = find_profile(d, id))) return E_NOT_SUPPORTED;
    if (!out) { *count = p->nplacements; return OK; }
    if (*count < p->nplacements) return E_SIZE;
    for (unsigned int i = 0; i < p->nplacements; i++) {
        out[i].start = p->placements[i];
        out[i].size = p->slices;
    }
    *count = p->nplacements;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t d, unsigned int id,
                                                       unsigned int *count) {
    struct profile *p;
    CHECK(d, !count);
    if (!d->mig_capable || !(p = find_profile(d, id))) return E_NOT_SUPPORTED;
    if (!d->mig_mode) return E_NOT_SUPPORTED;  /* as NVML: MIG mode must be on */
    *count = p->remaining;
    return OK;
}

/* The GPU's fabric state and status as <scenario>.fabric sets them now, if it does. */
static void fabric_now(const struct gpu *g, unsigned int *state, nvmlReturn_t *status) {
    char path[4200], line[64];
    int index, st, rc;
    FILE *f;
    snprintf(path, sizeof path, "%s.fabric", scenario);
    if (!(f = fopen(path, "r"))) return;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%d %d %d", &index, &st, &rc) == 3 && index == g->index) {
            *state = (unsigned int)st;
            *status = rc;
        }
    fclose(f);
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t d, nvmlGpuFabricInfo_t *f) {
    CHECK(d, !f);
    if (!d->has_fabric) return E_NOT_SUPPORTED;
    memcpy(f->clusterUuid, d->fabric_uuid, 16);
    f->status = OK;
    f->cliqueId = d->fabric_clique;
    f->state = d->fabric_state;
    fabric_now(d, &f->state, &f->status);
    return OK;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized) return E_UNINIT;
    if (!set) return E_INVALID;
    *set = calloc(1, sizeof **set);
    return *set ? OK : E_INVALID;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!initialized) return E_UNINIT;
    free(set);
    return OK;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                      nvmlEventSet_t set) {
    CHECK(d, !set);
    if (types & ~XID_CRITICAL) return E_NOT_SUPPORTED;
    set->mask[d->index] |= types;
    return OK;
}
/* The next unread "<index> <xid>" line of <scenario>.xid, if any. */
static int next_xid(int *index, unsigned long long *xid) {
    char path[4200], line[128];
    FILE *f;
    int got = 0;
    snprintf(path, sizeof path, "%s.xid", scenario);
    if (!(f = fopen(path, "r"))) return 0;
    if (fseek(f, xid_offset, SEEK_SET) == 0 && fgets(line, sizeof line, f)
        && strchr(line, '\n') && sscanf(line, "%d %llu", index, xid) == 2) {
        xid_offset = ftell(f);
        got = 1;
    }
    fclose(f);
    return got;
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms) {
    struct timespec step = {0, 10 * 1000 * 1000};
    if (!initialized) return E_UNINIT;
    if (!set || !data) return E_INVALID;
    for (unsigned int waited = 0;; waited += 10) {
        int index;
        unsigned long long xid;
        while (next_xid(&index, &xid)) {
            if (index < 0 || index >= ngpus || !(set->mask[index] & XID_CRITICAL)) continue;
            memset(data, 0, sizeof *data);
            data->device = &gpus[index];
            data->eventType = XID_CRITICAL;
            data->eventData = xid;
            data->gpuInstanceId = data->computeInstanceId = 0xffffffff;
            return OK;
        }
        if (waited >= ms) return E_TIMEOUT;
        nanosleep(&step, NULL);
    }
}
