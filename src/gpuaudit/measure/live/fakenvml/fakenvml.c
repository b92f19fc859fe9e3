/*
 * fakenvml.c: a fake libnvidia-ml.so.1 for testing gpuaudit against the REAL pynvml binding.
 *
 * Build:  gcc -shared -fPIC -O2 -o libnvidia-ml.so.1 fakenvml.c -lm
 * Use:    GPUAUDIT_FAKE_NVML_SCENARIO=scenario.json LD_LIBRARY_PATH=<dir> python ...
 *         (or gpuaudit.measure.live.nvml.load_library("<dir>/libnvidia-ml.so.1") in-process)
 *
 * It exports the NVML entry points gpuaudit's backend calls, with NVML's C ABI (structure
 * layouts as in nvml.h / pynvml), and answers from the scenario JSON read at every
 * nvmlInit. The scenario format and the values derived from it are those of
 * gpuaudit/measure/live/fake_nvml.py (see its module docstring); the tests check the two agree.
 * Functions listed in "missing" return NVML_ERROR_FUNCTION_NOT_FOUND, which pynvml raises
 * as NVMLError_FunctionNotFound exactly as for an absent symbol.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

/* ---------------------------------------------------------------- a small JSON reader */
enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct jnode {
    int type;
    double num;
    char *str;
    int n;
    char **keys;
    struct jnode **items;
} jnode;

static const char *jp;

static void jskip(void) { while (*jp && isspace((unsigned char)*jp)) jp++; }

static jnode *jnew(int type) {
    jnode *x = calloc(1, sizeof(jnode));
    x->type = type;
    return x;
}

static char *jstring(void) {
    size_t cap = 16, len = 0;
    char *s = malloc(cap);
    jp++; /* opening quote */
    while (*jp && *jp != '"') {
        char c = *jp++;
        if (c == '\\' && *jp) {
            char e = *jp++;
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'u' ? '?' : e;
            if (e == 'u') { int k; for (k = 0; k < 4 && *jp; k++) jp++; }
        }
        if (len + 2 > cap) { cap *= 2; s = realloc(s, cap); }
        s[len++] = c;
    }
    if (*jp == '"') jp++;
    s[len] = 0;
    return s;
}

static jnode *jvalue(void);

static void jpush(jnode *x, char *key, jnode *v) {
    x->items = realloc(x->items, sizeof(jnode *) * (x->n + 1));
    x->keys = realloc(x->keys, sizeof(char *) * (x->n + 1));
    x->items[x->n] = v;
    x->keys[x->n] = key;
    x->n++;
}

static jnode *jvalue(void) {
    jskip();
    if (*jp == '{') {
        jnode *x = jnew(J_OBJ);
        jp++;
        for (;;) {
            jskip();
            if (*jp == '}') { jp++; break; }
            if (*jp != '"') return NULL;
            char *k = jstring();
            jskip();
            if (*jp != ':') return NULL;
            jp++;
            jnode *v = jvalue();
            if (!v) return NULL;
            jpush(x, k, v);
            jskip();
            if (*jp == ',') { jp++; continue; }
            if (*jp == '}') { jp++; break; }
            return NULL;
        }
        return x;
    }
    if (*jp == '[') {
        jnode *x = jnew(J_ARR);
        jp++;
        for (;;) {
            jskip();
            if (*jp == ']') { jp++; break; }
            jnode *v = jvalue();
            if (!v) return NULL;
            jpush(x, NULL, v);
            jskip();
            if (*jp == ',') { jp++; continue; }
            if (*jp == ']') { jp++; break; }
            return NULL;
        }
        return x;
    }
    if (*jp == '"') { jnode *x = jnew(J_STR); x->str = jstring(); return x; }
    if (!strncmp(jp, "true", 4)) { jp += 4; jnode *x = jnew(J_BOOL); x->num = 1; return x; }
    if (!strncmp(jp, "false", 5)) { jp += 5; return jnew(J_BOOL); }
    if (!strncmp(jp, "null", 4)) { jp += 4; return jnew(J_NULL); }
    char *end;
    double d = strtod(jp, &end);
    if (end == jp) return NULL;
    jp = end;
    jnode *x = jnew(J_NUM);
    x->num = d;
    return x;
}

static void jfree(jnode *x) {
    if (!x) return;
    for (int i = 0; i < x->n; i++) { jfree(x->items[i]); free(x->keys[i]); }
    free(x->items);
    free(x->keys);
    free(x->str);
    free(x);
}

static jnode *jget(jnode *o, const char *key) {
    if (!o || o->type != J_OBJ) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return o->items[i];
    return NULL;
}

static double jnum(jnode *o, const char *key, double dflt) {
    jnode *v = jget(o, key);
    return (v && (v->type == J_NUM || v->type == J_BOOL)) ? v->num : dflt;
}

static const char *jstr(jnode *o, const char *key, const char *dflt) {
    jnode *v = jget(o, key);
    return (v && v->type == J_STR) ? v->str : dflt;
}

static int jhas(jnode *arr, const char *s) {
    if (!arr || arr->type != J_ARR) return 0;
    for (int i = 0; i < arr->n; i++)
        if (arr->items[i]->type == J_STR && !strcmp(arr->items[i]->str, s)) return 1;
    return 0;
}

/* ---------------------------------------------------------------- the scenario */
typedef struct device {
    jnode *spec;        /* this device's object in the scenario */
    struct device *parent;
    struct device *mig;
    int n_mig;
    int index;
    char uuid[96];
    double energy_mj;
    double energy_t;
    int energy_seen;
} device;

typedef struct { double t; device *dev; int set; } gpm_sample;

static jnode *scenario;
static device *gpus;
static int n_gpus;
static double t0;
static int initialised;

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int missing(const char *fn) { return jhas(jget(scenario, "missing"), fn); }

static double pattern(jnode *p, double t) {
    if (!p) return 0.0;
    const char *kind = jstr(p, "kind", "constant");
    if (!strcmp(kind, "constant")) return jnum(p, "value", 0.0);
    double lo = jnum(p, "low", 0.0), hi = jnum(p, "high", 100.0);
    double period = jnum(p, "period_s", 1.0);
    if (!strcmp(kind, "square")) {
        double phase = fmod(t, period) / period;
        return phase < jnum(p, "duty", 0.5) ? hi : lo;
    }
    if (!strcmp(kind, "sawtooth")) return lo + (hi - lo) * (fmod(t, period) / period);
    if (!strcmp(kind, "steps")) {
        jnode *v = jget(p, "values");
        if (!v || v->type != J_ARR || v->n == 0) return 0.0;
        int k = (int)(t / jnum(p, "step_s", 1.0));
        if (k > v->n - 1) k = v->n - 1;
        return v->items[k]->num;
    }
    return 0.0;
}

static double util(device *d, double t) {
    double u = pattern(jget(d->spec, "pattern"), t);
    return u < 0 ? 0 : u > 100 ? 100 : u;
}

static device *gpu_of(device *d) { return d->parent ? d->parent : d; }

static int not_supported(device *d, const char *what) {
    return jhas(jget(d->spec, "not_supported"), what);
}

static double power_mw(device *d, double t) {
    double idle = jnum(d->spec, "power_idle_w", 70.0), peak = jnum(d->spec, "power_max_w", 700.0);
    return (idle + (peak - idle) * util(d, t) / 100.0) * 1000.0;
}

/* Common entry: FunctionNotFound, Uninitialized, GPU lost. Sets *t to seconds since init. */
static nvmlReturn_t enter(const char *fn, device *d, double *t) {
    if (missing(fn)) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    double now = mono() - t0;
    if (t) *t = now;
    if (d) {
        jnode *lost = jget(gpu_of(d)->spec, "lost_at_s");
        if (lost && lost->type == J_NUM && now >= lost->num) return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}

#define ENTER(fn, d, t) do { nvmlReturn_t r_ = enter(fn, d, t); if (r_) return r_; } while (0)

static void free_devices(void) {
    for (int i = 0; i < n_gpus; i++) free(gpus[i].mig);
    free(gpus);
    gpus = NULL;
    n_gpus = 0;
}

static nvmlReturn_t load(void) {
    const char *path = getenv("GPUAUDIT_FAKE_NVML_SCENARIO");
    char *text = NULL;
    if (path && *path) {
        FILE *f = fopen(path, "rb");
        if (!f) { fprintf(stderr, "fakenvml: cannot open scenario %s\n", path); return NVML_ERROR_UNKNOWN; }
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = malloc(size + 1);
        size_t got = fread(text, 1, size, f);
        text[got] = 0;
        fclose(f);
    } else {
        text = strdup("{\"gpus\": [{}]}");
    }
    jfree(scenario);
    jp = text;
    scenario = jvalue();
    free(text);
    if (!scenario || scenario->type != J_OBJ) {
        fprintf(stderr, "fakenvml: scenario %s is not a JSON object\n", path ? path : "");
        jfree(scenario);
        scenario = NULL;
        return NVML_ERROR_UNKNOWN;
    }
    free_devices();
    jnode *arr = jget(scenario, "gpus");
    n_gpus = (arr && arr->type == J_ARR) ? arr->n : 0;
    gpus = calloc(n_gpus ? n_gpus : 1, sizeof(device));
    for (int i = 0; i < n_gpus; i++) {
        device *g = &gpus[i];
        g->spec = arr->items[i];
        g->index = i;
        snprintf(g->uuid, sizeof g->uuid, "%s",
                 jstr(g->spec, "uuid", ""));
        if (!g->uuid[0]) snprintf(g->uuid, sizeof g->uuid, "GPU-fa4e0000-0000-4000-8000-%012x", i);
        g->energy_mj = jnum(g->spec, "energy_start_j", 1000000.0) * 1000.0;
        jnode *mig = jget(g->spec, "mig");
        g->n_mig = (mig && mig->type == J_ARR) ? mig->n : 0;
        g->mig = calloc(g->n_mig ? g->n_mig : 1, sizeof(device));
        for (int j = 0; j < g->n_mig; j++) {
            device *m = &g->mig[j];
            m->spec = mig->items[j];
            m->parent = g;
            m->index = j;
            snprintf(m->uuid, sizeof m->uuid, "%s", jstr(m->spec, "uuid", ""));
            if (!m->uuid[0])
                snprintf(m->uuid, sizeof m->uuid, "MIG-fa4e%04x-0000-4000-8000-%012x", i, j);
        }
    }
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- NVML types */
typedef device *nvmlDevice_t;
typedef gpm_sample *nvmlGpmSample_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef union {
    double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
    long long sllVal; int siVal; unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
#define NVML_GPM_METRIC_MAX 477
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

/* ---------------------------------------------------------------- init */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t r = load();
    if (r) return r;
    if (missing("nvmlInit")) return NVML_ERROR_LIBRARY_NOT_FOUND;
    if (jnum(scenario, "driver_not_loaded", 0)) return NVML_ERROR_DRIVER_NOT_LOADED;
    t0 = mono();
    initialised = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    ENTER("nvmlShutdown", NULL, NULL);
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_str(const char *s, char *buf, unsigned int len) {
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, s);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER("nvmlSystemGetDriverVersion", NULL, NULL);
    return copy_str(jstr(scenario, "driver_version", "550.54.15"), version, length);
}

/* ---------------------------------------------------------------- enumeration */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER("nvmlDeviceGetCount", NULL, NULL);
    *count = (unsigned int)n_gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER("nvmlDeviceGetHandleByIndex", NULL, NULL);
    if ((int)index >= n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    ENTER("nvmlDeviceGetUUID", d, NULL);
    return copy_str(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    ENTER("nvmlDeviceGetName", d, NULL);
    char buf[256];
    const char *model = jstr(gpu_of(d)->spec, "name", "NVIDIA H100 80GB HBM3");
    if (d->parent)
        snprintf(buf, sizeof buf, "%s MIG %s", model, jstr(d->spec, "profile", "1g.10gb"));
    else
        snprintf(buf, sizeof buf, "%s", model);
    return copy_str(buf, name, length);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    ENTER("nvmlDeviceGetMigMode", d, NULL);
    if (!jget(d->spec, "mig") && !jnum(d->spec, "mig_capable", 0)) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = d->n_mig ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    ENTER("nvmlDeviceGetMaxMigDeviceCount", d, NULL);
    *count = 7;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index,
                                                 nvmlDevice_t *mig) {
    ENTER("nvmlDeviceGetMigDeviceHandleByIndex", d, NULL);
    if ((int)index >= d->n_mig) return NVML_ERROR_NOT_FOUND;
    *mig = &d->mig[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    ENTER("nvmlDeviceGetGpuInstanceId", d, NULL);
    if (!d->parent) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)jnum(d->spec, "gi", d->index + 1);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- readings */
#define WHOLE(d) do { if ((d)->parent) return NVML_ERROR_NOT_SUPPORTED; } while (0)
#define SUPPORTED(d, what) do { if (not_supported(d, what)) return NVML_ERROR_NOT_SUPPORTED; } while (0)

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    double t;
    ENTER("nvmlDeviceGetUtilizationRates", d, &t);
    WHOLE(d);
    SUPPORTED(d, "utilization");
    double v = util(d, t);
    u->gpu = (unsigned int)(v + 0.5);
    u->memory = (unsigned int)(v / 2 + 0.5);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    double t;
    ENTER("nvmlDeviceGetMemoryInfo", d, &t);
    SUPPORTED(d, "memory");
    double total_mib = jnum(d->spec, "memory_total_mib", d->parent ? 9984 : 81559);
    unsigned long long total = (unsigned long long)(total_mib * 1048576.0);
    unsigned long long used = (unsigned long long)(total * (0.05 + 0.5 * util(d, t) / 100.0));
    m->total = total;
    m->used = used;
    m->free = total - used;
    return NVML_SUCCESS;
}

static double energy_mj(device *d, double t) {
    if (d->energy_seen) {
        double dt = t - d->energy_t;
        d->energy_mj += power_mw(d, t) * (dt > 0 ? dt : 0);
    }
    d->energy_seen = 1;
    d->energy_t = t;
    return d->energy_mj;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    double t;
    ENTER("nvmlDeviceGetFieldValues", d, &t);
    SUPPORTED(d, "fields");
    for (int k = 0; k < count; k++) {
        nvmlFieldValue_t *v = &values[k];
        const char *name = v->fieldId == 186 ? "power_instant" : v->fieldId == 185 ? "power_average"
                         : v->fieldId == 83 ? "energy" : v->fieldId == 4 ? "ecc" : NULL;
        v->timestamp = (long long)(t * 1e6);
        v->latencyUsec = 0;
        if (!name || d->parent || not_supported(d, name)) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        v->nvmlReturn = NVML_SUCCESS;
        if (!strcmp(name, "power_instant") || !strcmp(name, "power_average")) {
            v->valueType = 1;
            v->value.uiVal = (unsigned int)power_mw(d, t);
        } else if (!strcmp(name, "energy")) {
            v->valueType = 3;
            v->value.ullVal = (unsigned long long)energy_mj(d, t);
        } else {
            v->valueType = 3;
            v->value.ullVal = (unsigned long long)jnum(d->spec, "ecc_dbe", 0);
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    double t;
    ENTER("nvmlDeviceGetPowerUsage", d, &t);
    WHOLE(d);
    SUPPORTED(d, "power_usage");
    *mw = (unsigned int)power_mw(d, t);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    double t;
    ENTER("nvmlDeviceGetTotalEnergyConsumption", d, &t);
    WHOLE(d);
    SUPPORTED(d, "energy");
    *mj = (unsigned long long)energy_mj(d, t);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter,
                                         unsigned long long *count) {
    (void)type; (void)counter;
    ENTER("nvmlDeviceGetTotalEccErrors", d, NULL);
    WHOLE(d);
    SUPPORTED(d, "ecc");
    *count = (unsigned long long)jnum(d->spec, "ecc_dbe", 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    ENTER("nvmlDeviceGetEnforcedPowerLimit", d, NULL);
    WHOLE(d);
    SUPPORTED(d, "power_limit");
    *mw = (unsigned int)(jnum(d->spec, "power_limit_w", jnum(d->spec, "power_max_w", 700.0)) * 1000);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp) {
    double t;
    (void)sensor;
    ENTER("nvmlDeviceGetTemperature", d, &t);
    WHOLE(d);
    SUPPORTED(d, "temperature");
    double lo = jnum(d->spec, "temp_idle_c", 30.0), hi = jnum(d->spec, "temp_max_c", 75.0);
    *temp = (unsigned int)(lo + (hi - lo) * util(d, t) / 100.0 + 0.5);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    double t;
    (void)type;
    ENTER("nvmlDeviceGetClockInfo", d, &t);
    WHOLE(d);
    SUPPORTED(d, "clock");
    *mhz = util(d, t) < 1.0 ? 345 : (unsigned int)jnum(d->spec, "sm_clock_mhz", 1980);
    return NVML_SUCCESS;
}

static nvmlReturn_t reasons(const char *fn, nvmlDevice_t d, unsigned long long *r) {
    double t;
    ENTER(fn, d, &t);
    WHOLE(d);
    SUPPORTED(d, "clocks_event_reasons");
    *r = util(d, t) < 1.0 ? 1 : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) {
    return reasons("nvmlDeviceGetCurrentClocksEventReasons", d, r);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    return reasons("nvmlDeviceGetCurrentClocksThrottleReasons", d, r);
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbps) {
    double t;
    ENTER("nvmlDeviceGetPcieThroughput", d, &t);
    WHOLE(d);
    SUPPORTED(d, "pcie");
    *kbps = (unsigned int)(util(d, t) * 1024 * (counter == 0 ? 1 : 2));
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- GPM */
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
    ENTER("nvmlGpmQueryDeviceSupport", d, NULL);
    s->isSupportedDevice = jnum(gpu_of(d)->spec, "gpm", 0) ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *s) {
    ENTER("nvmlGpmSampleAlloc", NULL, NULL);
    *s = calloc(1, sizeof(gpm_sample));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) {
    ENTER("nvmlGpmSampleFree", NULL, NULL);
    free(s);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) {
    double t;
    ENTER("nvmlGpmSampleGet", d, &t);
    if (!jnum(d->spec, "gpm", 0)) return NVML_ERROR_NOT_SUPPORTED;
    s->t = t;
    s->dev = d;
    s->set = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned int gi, nvmlGpmSample_t s) {
    double t;
    ENTER("nvmlGpmMigSampleGet", d, &t);
    if (!jnum(d->spec, "gpm", 0)) return NVML_ERROR_NOT_SUPPORTED;
    for (int j = 0; j < d->n_mig; j++) {
        if ((unsigned int)jnum(d->mig[j].spec, "gi", j + 1) == gi) {
            s->t = t;
            s->dev = &d->mig[j];
            s->set = 1;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *req) {
    ENTER("nvmlGpmMetricsGet", NULL, NULL);
    gpm_sample *s1 = req->sample1, *s2 = req->sample2;
    if (!s1 || !s2 || !s1->set || !s2->set || s1->dev != s2->dev) return NVML_ERROR_INVALID_ARGUMENT;
    double u = util(s2->dev, s2->t);
    double tensor = jnum(gpu_of(s2->dev)->spec, "tensor_ratio", 0.6);
    for (unsigned int k = 0; k < req->numMetrics && k < NVML_GPM_METRIC_MAX; k++) {
        nvmlGpmMetric_t *m = &req->metrics[k];
        double v;
        switch (m->metricId) {
        case 1: v = u; break;
        case 2: v = 0.9 * u; break;
        case 3: v = 0.4 * u; break;
        case 5: v = tensor * u; break;
        case 10: v = 0.3 * u; break;
        case 20: v = u; break;
        case 21: v = 2.0 * u; break;
        case 60: case 61: v = 0.1 * u; break;
        default: m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; continue;
        }
        m->nvmlReturn = NVML_SUCCESS;
        m->value = v;
    }
    return NVML_SUCCESS;
}
