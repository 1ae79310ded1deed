/* ember_run: run a model exported by Ember (ember_model.c, ember_model.h, weights.bin) on .npy files.

     ember_run --input NAME=FILE.npy [...] --output-dir OUT [--repeat N] [--warmup N] [--weights PATH] [--threads N]

   Reads every model input from a .npy file (C order, the model's dtype and shape; a model with symbolic sizes takes
   them from the inputs' shapes: ember_model_set_shapes), loads the weights (default:
   weights.bin beside this program), runs the model `warmup` times untimed and `repeat` times timed, writes each
   output to OUT/<output name>.npy (OUT and its parents are created if missing; characters other than letters,
   digits, '.', '-' and '_' become '_') and prints one JSON line on stdout (times in seconds; threads: the count
   of the model's thread pool):

     {"model": "mlp", "repeat": 10, "warmup": 1, "threads": 4, "min": 1.2e-05, "median": 1.3e-05,
      "mean": 1.3e-05, "unit": "s", "outputs": {"y": "OUT/y.npy"}}

   --threads defaults to the target's -threads when it had one (EMBER_MODEL_THREADS), else $OMP_NUM_THREADS, else
   all cores (the model library's thread pool: ember/codegen/c_pool.py).
   Exit status: 0; 2 for a bad command line or input (wrong shape or dtype, missing or unknown input; the message
   on stderr names it); 1 when the weights cannot be read, the model fails or an output cannot be written.
   Needs only libc (with pthreads), libm and (optionally) OpenMP:
     cc -O2 -std=gnu11 [-fopenmp] ember_run.c ember_model.c -o ember_run -lm -pthread */

#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ember_model.h"

/* The model library's thread pool (defined in ember_model.c) */
void ember_set_num_threads(int32_t n);
int32_t ember_get_num_threads(void);

#define ALIGN 64
#define USAGE                                                                                               \
  "usage: ember_run --input NAME=FILE.npy [...] --output-dir DIR [--repeat N] [--warmup N] [--weights PATH] " \
  "[--threads N]\n"

static int fail(int status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("ember_run: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return status;
}

static void* alloc_aligned(size_t nbytes) {
  size_t size = (nbytes + ALIGN - 1) / ALIGN * ALIGN;
  return aligned_alloc(ALIGN, size ? size : ALIGN);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- .npy files --------------------------------------------------------------------------------------------- */

/* "(2, 3)" for a shape, into buf ("?" for a symbolic dim, -1 in the model's tables). */
static const char* shape_text(char* buf, size_t size, int rank, const int64_t* dims) {
  size_t n = (size_t)snprintf(buf, size, "(");
  for (int i = 0; i < rank && n < size; i++)
    n += dims[i] < 0 ? (size_t)snprintf(buf + n, size - n, "%s?", i ? ", " : "")
                     : (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)dims[i]);
  if (n < size) snprintf(buf + n, size - n, rank == 1 ? ",)" : ")");
  return buf;
}

/* Where the value of `key` starts in a .npy header dict (after the colon and spaces), or NULL. */
static const char* dict_value(const char* header, const char* key) {
  size_t len = strlen(key);
  for (const char* p = header; *p; p++) {
    if ((*p == '\'' || *p == '"') && strncmp(p + 1, key, len) == 0 && p[len + 1] == *p) {
      p += len + 2;
      while (*p == ' ') p++;
      if (*p++ != ':') return NULL;
      while (*p == ' ') p++;
      return p;
    }
  }
  return NULL;
}

/* Whether two numpy descrs name the same dtype ('|u1' and '<u1' do: one byte has no byte order). */
static int same_dtype(const char* a, const char* b) {
  if (strcmp(a, b) == 0) return 1;
  return strlen(a) == 3 && strlen(b) == 3 && strcmp(a + 1, b + 1) == 0 && a[2] == '1' && strchr("<>|=", a[0]) &&
         strchr("<>|=", b[0]);
}

/* The bytes of one element of a numpy descr ("<f4": 4). */
static size_t descr_itemsize(const char* descr) { return (size_t)strtoul(descr + 2, NULL, 10); }

/* The data of an .npy file checked against the model's tensor `t` (its dtype, rank and static dims; a symbolic dim,
   -1, takes any size and ember_model_set_shapes checks it), in a fresh aligned buffer, its dims in `dims` (the
   model's rank); NULL after an error message naming the input. */
static void* read_npy(const char* path, const ember_model_tensor* t, int64_t* dims) {
  void* data = NULL;
  char* header = NULL;
  char want[256], got[256], descr[32];
  int rank = 0;
  FILE* f = fopen(path, "rb");
  unsigned char pre[10];
  if (f == NULL) {
    fail(2, "input '%s': cannot open %s: %s", t->name, path, strerror(errno));
    return NULL;
  }
  if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
    fail(2, "input '%s': %s is not a .npy file", t->name, path);
    goto done;
  }
  size_t hlen;
  if (pre[6] == 1 && fread(pre + 8, 1, 2, f) == 2) {
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
  } else if ((pre[6] == 2 || pre[6] == 3) && fread(pre + 8, 1, 2, f) == 2 && fread(pre, 1, 2, f) == 2) {
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[0] << 16 | (size_t)pre[1] << 24;
  } else {
    fail(2, "input '%s': %s: unsupported .npy version %d.%d", t->name, path, pre[6], pre[7]);
    goto done;
  }
  header = (char*)malloc(hlen + 1);
  if (header == NULL || fread(header, 1, hlen, f) != hlen) {
    fail(2, "input '%s': %s: truncated .npy header", t->name, path);
    goto done;
  }
  header[hlen] = '\0';
  const char* d = dict_value(header, "descr");
  const char* fo = dict_value(header, "fortran_order");
  const char* sh = dict_value(header, "shape");
  size_t n = 0;
  if (d == NULL || fo == NULL || sh == NULL || (*d != '\'' && *d != '"') || *sh != '(') {
    fail(2, "input '%s': %s: cannot read the .npy header %s", t->name, path, header);
    goto done;
  }
  for (const char* p = d + 1; *p && *p != *d && n + 1 < sizeof descr; p++) descr[n++] = *p;
  descr[n] = '\0';
  if (strncmp(fo, "False", 5) != 0) {
    fail(2, "input '%s': %s is in Fortran order; write it in C order (np.ascontiguousarray)", t->name, path);
    goto done;
  }
  for (const char* p = sh + 1; *p && *p != ')';) {
    char* end;
    long long v = strtoll(p, &end, 10);
    if (end == p || rank == 64) {
      fail(2, "input '%s': %s: cannot read the shape in the .npy header %s", t->name, path, header);
      goto done;
    }
    dims[rank++] = v;
    for (p = end; *p == ' ' || *p == ','; p++) {
    }
  }
  if (!same_dtype(descr, t->dtype)) {
    fail(2, "input '%s': %s holds dtype %s, the model takes %s", t->name, path, descr, t->dtype);
    goto done;
  }
  int same = rank == t->rank;
  for (int i = 0; same && i < rank; i++) same = t->dims[i] < 0 || dims[i] == t->dims[i];
  if (!same) {
    fail(2, "input '%s': %s holds shape %s, the model takes %s", t->name, path, shape_text(got, sizeof got, rank, dims),
         shape_text(want, sizeof want, t->rank, t->dims));
    goto done;
  }
  size_t nbytes = descr_itemsize(t->dtype);
  for (int i = 0; i < rank; i++) nbytes *= (size_t)dims[i];
  data = alloc_aligned(nbytes);
  if (data == NULL || fread(data, 1, nbytes, f) != nbytes) {
    fail(2, "input '%s': %s holds fewer than the %zu bytes of data its header promises", t->name, path, nbytes);
    free(data);
    data = NULL;
  }
done:
  free(header);
  fclose(f);
  return data;
}

/* Write `data` (`nbytes`, of shape `dims`) as a version 1.0 .npy file; 0 on success. */
static int write_npy(const char* path, const ember_model_tensor* t, const int64_t* dims, size_t nbytes,
                     const void* data) {
  char header[1024], shape[512];
  int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", t->dtype,
                   shape_text(shape, sizeof shape, t->rank, dims));
  if (n < 0 || (size_t)n + 64 >= sizeof header) return -1;
  while ((10 + n + 1) % 64 != 0) header[n++] = ' ';
  header[n++] = '\n';
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
  FILE* f = fopen(path, "wb");
  if (f == NULL) return -1;
  int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, (size_t)n, f) == (size_t)n &&
           fwrite(data, 1, nbytes, f) == nbytes;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* ---- the program -------------------------------------------------------------------------------------------- */

static void json_string(FILE* out, const char* s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(out, "\\%c", c);
    else if (c < 0x20)
      fprintf(out, "\\u%04x", c);
    else
      fputc(c, out);
  }
  fputc('"', out);
}

/* mkdir -p: 0 when `path` is a directory now. */
static int make_dirs(const char* path) {
  size_t n = strlen(path);
  char* p = (char*)malloc(n + 1);
  int rc = 0;
  if (p == NULL) return -1;
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n && rc == 0; i++) {
    if (p[i] == '/' || p[i] == '\0') {
      char c = p[i];
      p[i] = '\0';
      if (mkdir(p, 0777) != 0 && errno != EEXIST) rc = -1;
      p[i] = c;
    }
  }
  free(p);
  return rc;
}

static int compare_doubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static int parse_count(const char* text, const char* flag, int lowest, int* out) {
  char* end;
  long v = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < lowest || v > 1000000000L) {
    fail(2, "%s wants an integer >= %d, got '%s'", flag, lowest, text);
    return -1;
  }
  *out = (int)v;
  return 0;
}

int main(int argc, char** argv) {
  const char* files[EMBER_MODEL_NUM_INPUTS + 1] = {NULL};
  const char* out_dir = NULL;
  const char* weights = NULL;
  int repeat = 1, warmup = 0, threads = 0, status = 0;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(USAGE, stdout);
      return 0;
    }
    if (i + 1 >= argc) return fail(2, "%s wants a value\n" USAGE, a);
    const char* v = argv[++i];
    if (strcmp(a, "--input") == 0) {
      const char* eq = strchr(v, '=');
      if (eq == NULL) return fail(2, "--input wants NAME=FILE.npy, got '%s'", v);
      int k = 0;
      while (k < EMBER_MODEL_NUM_INPUTS && !(strncmp(ember_model_inputs[k].name, v, (size_t)(eq - v)) == 0 &&
                                             ember_model_inputs[k].name[eq - v] == '\0'))
        k++;
      if (k == EMBER_MODEL_NUM_INPUTS) {
        fprintf(stderr, "ember_run: unknown input '%.*s'; the model's inputs are:", (int)(eq - v), v);
        for (int j = 0; j < EMBER_MODEL_NUM_INPUTS; j++) fprintf(stderr, " '%s'", ember_model_inputs[j].name);
        fputc('\n', stderr);
        return 2;
      }
      if (files[k] != NULL) return fail(2, "input '%s' is given twice", ember_model_inputs[k].name);
      files[k] = eq + 1;
    } else if (strcmp(a, "--output-dir") == 0) {
      out_dir = v;
    } else if (strcmp(a, "--weights") == 0) {
      weights = v;
    } else if (strcmp(a, "--repeat") == 0) {
      if (parse_count(v, a, 1, &repeat)) return 2;
    } else if (strcmp(a, "--warmup") == 0) {
      if (parse_count(v, a, 0, &warmup)) return 2;
    } else if (strcmp(a, "--threads") == 0) {
      if (parse_count(v, a, 1, &threads)) return 2;
    } else {
      return fail(2, "unknown option '%s'\n" USAGE, a);
    }
  }
  if (out_dir == NULL) return fail(2, "--output-dir is required\n" USAGE);
  for (int k = 0; k < EMBER_MODEL_NUM_INPUTS; k++) {
    if (files[k] == NULL) {
      char shape[512];
      const ember_model_tensor* t = &ember_model_inputs[k];
      return fail(2, "missing input '%s' (%s %s): pass --input %s=FILE.npy", t->name, t->dtype,
                  shape_text(shape, sizeof shape, t->rank, t->dims), t->name);
    }
  }

  /* the weights: weights.bin beside the program unless --weights says otherwise */
  char* default_weights = NULL;
  if (weights == NULL) {
    const char* slash = strrchr(argv[0], '/');
    size_t dir = slash ? (size_t)(slash - argv[0]) + 1 : 0;
    default_weights = (char*)malloc(dir + sizeof "weights.bin");
    if (default_weights == NULL) return fail(1, "out of memory");
    memcpy(default_weights, argv[0], dir);
    memcpy(default_weights + dir, "weights.bin", sizeof "weights.bin");
    weights = default_weights;
  }

  void* inputs[EMBER_MODEL_NUM_INPUTS + 1] = {NULL};
  void* outputs[EMBER_MODEL_NUM_OUTPUTS + 1] = {NULL};
  double* times = (double*)calloc((size_t)repeat, sizeof(double));
  ember_model* m = NULL;
  int64_t shapes[EMBER_MODEL_NUM_INPUTS + 1][64];
  const int64_t* dims[EMBER_MODEL_NUM_INPUTS + 1];
  for (int k = 0; k < EMBER_MODEL_NUM_INPUTS && status == 0; k++) {
    dims[k] = shapes[k];
    if ((inputs[k] = read_npy(files[k], &ember_model_inputs[k], shapes[k])) == NULL) status = 2;
  }
  if (status == 0 && times == NULL) status = fail(1, "out of memory");
  if (status == 0 && (m = ember_model_create(weights)) == NULL)
    status = fail(1, "cannot load the weights from %s (missing, short, or out of memory); pass --weights PATH",
                  weights);
  if (status == 0 && ember_model_set_shapes(m, dims) != 0) status = fail(2, "%s", ember_model_error(m));
  for (int k = 0; k < EMBER_MODEL_NUM_OUTPUTS && status == 0; k++)
    if ((outputs[k] = alloc_aligned(ember_model_output_nbytes(m, k))) == NULL) status = fail(1, "out of memory");
  if (threads == 0) threads = EMBER_MODEL_THREADS;
  if (threads > 0) ember_set_num_threads(threads);
  int used_threads = ember_get_num_threads();
  for (int r = 0; r < warmup + repeat && status == 0; r++) {
    double t0 = now();
    int rc = ember_model_run(m, (const void* const*)inputs, outputs);
    if (r >= warmup) times[r - warmup] = now() - t0;
    if (rc != 0) status = fail(1, "the model failed (status %d: an allocation failed)", rc);
  }

  if (status == 0 && make_dirs(out_dir) != 0)
    status = fail(1, "cannot create the output directory %s: %s", out_dir, strerror(errno));
  char** paths = (char**)calloc(EMBER_MODEL_NUM_OUTPUTS + 1, sizeof(char*));
  if (status == 0 && paths == NULL) status = fail(1, "out of memory");
  for (int k = 0; k < EMBER_MODEL_NUM_OUTPUTS && status == 0; k++) {
    const ember_model_tensor* t = &ember_model_outputs[k];
    size_t dir = strlen(out_dir), len = strlen(t->name);
    char* p = paths[k] = (char*)malloc(dir + len + 6);
    if (p == NULL) {
      status = fail(1, "out of memory");
      break;
    }
    memcpy(p, out_dir, dir);
    p[dir] = '/';
    for (size_t j = 0; j < len; j++) {
      char c = t->name[j];
      int safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                 c == '_' || (c == '.' && j > 0);
      p[dir + 1 + j] = safe ? c : '_';
    }
    memcpy(p + dir + 1 + len, ".npy", 5);
    if (write_npy(p, t, ember_model_output_dims(m, k), ember_model_output_nbytes(m, k), outputs[k]) != 0)
      status = fail(1, "output '%s': cannot write %s: %s", t->name, p, strerror(errno));
  }

  if (status == 0) {
    double sum = 0, lowest = times[0];
    for (int r = 0; r < repeat; r++) {
      sum += times[r];
      if (times[r] < lowest) lowest = times[r];
    }
    qsort(times, (size_t)repeat, sizeof(double), compare_doubles);
    double median = repeat % 2 ? times[repeat / 2] : 0.5 * (times[repeat / 2 - 1] + times[repeat / 2]);
    printf("{\"model\": ");
    json_string(stdout, EMBER_MODEL_NAME);
    printf(", \"repeat\": %d, \"warmup\": %d, \"threads\": %d, \"min\": %.9g, \"median\": %.9g, \"mean\": %.9g, "
           "\"unit\": \"s\", \"outputs\": {",
           repeat, warmup, used_threads, lowest, median, sum / repeat);
    for (int k = 0; k < EMBER_MODEL_NUM_OUTPUTS; k++) {
      if (k) printf(", ");
      json_string(stdout, ember_model_outputs[k].name);
      printf(": ");
      json_string(stdout, paths[k]);
    }
    printf("}}\n");
  }

  ember_model_destroy(m);
  for (int k = 0; k < EMBER_MODEL_NUM_INPUTS; k++) free(inputs[k]);
  for (int k = 0; k < EMBER_MODEL_NUM_OUTPUTS; k++) free(outputs[k]);
  for (int k = 0; paths != NULL && k < EMBER_MODEL_NUM_OUTPUTS; k++) free(paths[k]);
  free(paths);
  free(times);
  free(default_weights);
  return status;
}
