/* A resumable scanner for Kineto / Chrome trace JSON that writes columns directly.
 *
 * Fed the document in chunks (any split), it parses the top-level object (or bare array) and
 * every item of "traceEvents", keeping only what the analyses use:
 *   ph, name, cat           -> int32 codes into one string table
 *   ts, dur                 -> float64 (NaN / 0.0 when absent)
 *   pid, tid                -> int32 codes into an identifier table (ints and strings kept apart)
 *   id and 13 args fields   -> sparse (event, field, int64) triples; values that are not plain
 *                              int64 (strings, floats, huge ints) are handed to Python as objects
 *   counter ("C") args      -> (event, series code, float64) rows
 *   args of cat "kinetoscope" events (the capture's loop marks: a few per step) -> (event, raw JSON bytes)
 *   "Input Dims", "Input type", "Concrete Inputs" of cat "cpu_op"/"Operator" events holding "Input Dims"
 *   (record_shapes)         -> (event, (dims, types or None, concrete or None)) as the JSON text written
 *   other top-level keys    -> (key, raw JSON bytes) for Python to decode
 * Everything else is validated as JSON and skipped without being materialised.
 *
 * It is deliberately strict: anything it does not handle exactly as the reference msgspec decoder
 * would (syntax errors, invalid UTF-8, raw control characters, lone surrogates, unusual field types,
 * duplicate kept keys, nesting past max_depth, non-object items) makes feed() return -1 ("bail"),
 * and the caller decodes the whole document with the reference path, which reports errors and
 * handles odd dialects. Every read is bounds-checked against the end of the current chunk: an item
 * cut by the chunk boundary is left unconsumed and parsed again from its start on the next call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__GLIBC__)
#include <locale.h>
#include <stdlib.h>
static locale_t c_locale; /* glibc's strtod_l is correctly rounded and thread-safe: no GIL needed */
#endif

enum { OK = 0, NEED = 1, BAIL = 2 };
#define ERR (-1) /* a Python exception is set */
#define CHECK(expr) do { int _r = (expr); if (_r != OK) return _r; } while (0)
enum { ST_START, ST_TOP_KEY_FIRST, ST_TOP_KEY, ST_TOP_AFTER, ST_EV_FIRST, ST_EV_NEXT, ST_EV_AFTER, ST_DONE };

#define N_ARG_FIELDS 20
#define N_FIELDS 21
#define F_NAME 12 /* args.name: a string code */
/* collective metadata (record_param_comms and NCCL kernels): three strings, four integers */
#define F_COLL_NAME 13
#define F_PG_NAME 14
#define F_PG_RANKS 15
#define F_ID 20   /* the event's own "id" (flows) */
#define IS_STRING_FIELD(f) ((f) == F_NAME || (f) == F_COLL_NAME || (f) == F_PG_NAME || (f) == F_PG_RANKS)
static const Py_ssize_t ARG_KEY_LEN[N_ARG_FIELDS] = {11, 6, 6, 11, 11, 5, 5, 15, 14, 11, 9, 4, 4,
                                                     15, 18, 19, 13, 14, 10, 3};
static const char *ARG_KEYS[N_ARG_FIELDS] = {"correlation", "device", "stream", "External id", "external id",
                                             "bytes", "Bytes", "Total Allocated", "Total Reserved",
                                             "Device Type", "Device Id", "Addr", "name",
                                             "Collective name", "Process Group Name", "Process Group Ranks",
                                             "In msg nelems", "Out msg nelems", "Group size", "Seq"};

/* ------------------------------------------------------------------ growable buffers */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap += cap / 2 + 4096;
    char *d = PyMem_RawRealloc(b->data, (size_t)cap);
    if (!d) return -1; /* out of memory: reported by feed() once it holds the GIL again */
    b->data = d;
    b->cap = cap;
    return 0;
}
static int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}
static void buf_free(Buf *b) { PyMem_RawFree(b->data); b->data = NULL; b->len = b->cap = 0; }

/* ------------------------------------------------------------------ interning tables */
typedef struct {
    uint64_t hash;
    Py_ssize_t off, len;
    int32_t code; /* -1: empty slot */
} Slot;

typedef struct {
    Slot *slots;
    size_t mask, used;
    Buf arena;  /* per entry: kind byte + key bytes */
    Buf index;  /* code -> offset of its entry in arena (Py_ssize_t) */
    int32_t count;
} Table;

static uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    /* eight bytes at a time, multiply-xorshift mixing: names are long and hashed for every event */
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, (size_t)n);
    h = (h ^ w) * 0x94D049BB133111EBULL;
    return h ^ (h >> 29);
}

static int table_init(Table *t) {
    t->mask = 1023;
    t->used = 0;
    t->count = 0;
    t->slots = PyMem_RawMalloc(sizeof(Slot) * (t->mask + 1));
    if (!t->slots) return -1;
    for (size_t i = 0; i <= t->mask; i++) t->slots[i].code = -1;
    memset(&t->arena, 0, sizeof(Buf));
    memset(&t->index, 0, sizeof(Buf));
    return 0;
}
static void table_free(Table *t) {
    PyMem_RawFree(t->slots);
    t->slots = NULL;
    buf_free(&t->arena);
    buf_free(&t->index);
}
static int table_grow(Table *t) {
    size_t nmask = t->mask * 2 + 1;
    Slot *ns = PyMem_RawMalloc(sizeof(Slot) * (nmask + 1));
    if (!ns) return -1;
    for (size_t i = 0; i <= nmask; i++) ns[i].code = -1;
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i].code < 0) continue;
        size_t j = t->slots[i].hash & nmask;
        while (ns[j].code >= 0) j = (j + 1) & nmask;
        ns[j] = t->slots[i];
    }
    PyMem_RawFree(t->slots);
    t->slots = ns;
    t->mask = nmask;
    return 0;
}

/* kind 's': key is UTF-8 text (validated) -> str; kind 'i': key is an int64 -> int. Returns the code, or
 * -1 when out of memory. No Python objects: the values are made by finish(). */
static int32_t table_get(Table *t, const char *key, Py_ssize_t n, char kind) {
    uint64_t h = hash_bytes(key, n) + (uint64_t)kind;
    size_t j = h & t->mask;
    while (t->slots[j].code >= 0) {
        Slot *s = &t->slots[j];
        if (s->hash == h && s->len == n + 1 && t->arena.data[s->off] == kind &&
            memcmp(t->arena.data + s->off + 1, key, (size_t)n) == 0)
            return s->code;
        j = (j + 1) & t->mask;
    }
    int32_t code = t->count;
    Py_ssize_t off = t->arena.len;
    if (buf_put(&t->arena, &kind, 1) < 0 || buf_put(&t->arena, key, n) < 0 || buf_put(&t->index, &off, sizeof off) < 0)
        return -1;
    t->count++;
    Slot *s = &t->slots[j];
    s->hash = h; s->off = off; s->len = n + 1; s->code = code;
    if (++t->used * 2 > t->mask && table_grow(t) < 0) return -1;
    return code;
}

/* ------------------------------------------------------------------ the scanner object */
typedef struct {
    PyObject_HEAD
    int state, bare, seen_events, max_depth;
    int events_not_list; /* a traceEvents key whose value is not a list (a later one may still be) */
    int at_bof; /* nothing consumed yet: a UTF-8 byte-order mark may come first */
    Py_ssize_t n;
    int64_t consumed; /* bytes consumed by earlier feed() calls */
    const char *reason;
    Table strings, idents;
    Buf ph, name, cat, ts, dur, pid, tid;   /* per event */
    Buf f_event, f_id, f_value;             /* sparse fields */
    Buf c_event, c_series, c_value;         /* counter rows */
    Buf scratch;                            /* unescaped strings */
    Buf ev_odd;                             /* odd values of the event being parsed */
    Buf odd;                                /* records: event, field, kind, length, bytes */
    Buf meta;                               /* records: key length, key, value length, raw value */
    Buf marks;                              /* records: event, args length, raw args */
    Buf shapes;                             /* records: event, then 3 x (length or -1, raw value) (ops' shapes) */
    int32_t code_empty, code_C, code_mark, code_cpu_op, code_operator, ident_empty;
    PyThreadState *tstate;                  /* while feed() runs without the GIL */
    int busy;
} Scanner;

#define BAILR(s, why) do { (s)->reason = (why); return BAIL; } while (0)
/* the top-level values other than traceEvents are kept raw and decoded into Python objects: a profiler
 * writes a few KiB there (deviceProperties, distributedInfo); past this, a file is not a trace */
#define META_MAX_BYTES (4 * 1024 * 1024)
#define MIN_EVENT_BYTES 24
#define MIN_EVENT_CHECK_AFTER 1000000
#define WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')

static inline const char *skip_ws(const char *p, const char *end) {
    while (p < end && WS(*p)) p++;
    return p;
}

/* UTF-8 validation of one multi-byte sequence at p (first byte >= 0x80). Returns its length, 0 if
 * invalid, -1 if cut by the end of the buffer. */
static int utf8_seq(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if (end - p < n) {
        /* cut: valid so far? */
        for (int i = 1; i < end - p; i++) {
            unsigned b = p[i];
            if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
        }
        return -1;
    }
    for (int i = 1; i < n; i++) {
        unsigned b = p[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return n;
}

static inline int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}
static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* A string starting at *pp (the opening quote). On OK: [*cs, *ce) is the raw content, *esc says
 * whether it holds escapes, *pp is past the closing quote. Validates escapes, surrogates, UTF-8. */
static int scan_string(Scanner *s, const char **pp, const char *end, const char **cs, const char **ce, int *esc) {
    const char *p = *pp + 1;
    *cs = p;
    *esc = 0;
    for (;;) {
        /* eight plain bytes at a time: no quote, backslash, control character or non-ASCII byte */
        while (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
            uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
            uint64_t stop = ((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w) | w;
            if (stop & high) break;
            p += 8;
        }
        while (p < end) {
            unsigned char c = (unsigned char)*p;
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            p++;
        }
        if (p >= end) return NEED;
        unsigned char c = (unsigned char)*p;
        if (c == '"') { *ce = p; *pp = p + 1; return OK; }
        if (c < 0x20) BAILR(s, "control character in a string");
        if (c >= 0x80) {
            int n = utf8_seq((const unsigned char *)p, (const unsigned char *)end);
            if (n < 0) return NEED;
            if (n == 0) BAILR(s, "invalid UTF-8");
            p += n;
            continue;
        }
        /* backslash */
        *esc = 1;
        if (end - p < 2) return NEED;
        char e = p[1];
        if (e == 'u') {
            if (end - p < 6) return NEED;
            int u = hex4(p + 2);
            if (u < 0) BAILR(s, "bad \\u escape");
            p += 6;
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (end - p < 6) { /* the low half may be in the next chunk, unless what is here rules it out */
                    if ((end - p >= 1 && p[0] != '\\') || (end - p >= 2 && p[1] != 'u')) BAILR(s, "lone surrogate");
                    return NEED;
                }
                if (p[0] != '\\' || p[1] != 'u') BAILR(s, "lone surrogate");
                int l = hex4(p + 2);
                if (l < 0xDC00 || l > 0xDFFF) BAILR(s, "lone surrogate");
                p += 6;
            } else if (u >= 0xDC00 && u <= 0xDFFF) {
                BAILR(s, "lone surrogate");
            }
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            p += 2;
        } else {
            BAILR(s, "bad escape");
        }
    }
}

static void put_utf8(char **o, unsigned cp) {
    char *q = *o;
    if (cp < 0x80) *q++ = (char)cp;
    else if (cp < 0x800) { *q++ = (char)(0xC0 | (cp >> 6)); *q++ = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { *q++ = (char)(0xE0 | (cp >> 12)); *q++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *q++ = (char)(0x80 | (cp & 0x3F)); }
    else { *q++ = (char)(0xF0 | (cp >> 18)); *q++ = (char)(0x80 | ((cp >> 12) & 0x3F)); *q++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *q++ = (char)(0x80 | (cp & 0x3F)); }
    *o = q;
}

/* The decoded bytes of a validated string's content (escapes resolved) in out / outn. */
static int string_bytes(Scanner *s, const char *cs, const char *ce, int esc, const char **out, Py_ssize_t *outn) {
    if (!esc) { *out = cs; *outn = ce - cs; return 0; }
    s->scratch.len = 0;
    if (buf_reserve(&s->scratch, ce - cs) < 0) return -1; /* unescaped is never longer */
    char *o = s->scratch.data;
    const char *p = cs;
    while (p < ce) {
        if (*p != '\\') { *o++ = *p++; continue; }
        char e = p[1];
        switch (e) {
        case 'u': {
            unsigned u = (unsigned)hex4(p + 2);
            p += 6;
            if (u >= 0xD800 && u <= 0xDBFF) {
                unsigned l = (unsigned)hex4(p + 2);
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (l - 0xDC00);
            }
            put_utf8(&o, u);
            continue;
        }
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        default: *o++ = e; break; /* " \ / */
        }
        p += 2;
    }
    *out = s->scratch.data;
    *outn = o - s->scratch.data;
    return 0;
}

enum { NUM_INT = 0, NUM_FRACTION = 1, NUM_EXPONENT = 2 };

/* A number starting at *pp; validates the JSON grammar. *form: NUM_INT, or the NUM_FRACTION and
 * NUM_EXPONENT bits of what it has. */
static int scan_number(Scanner *s, const char **pp, const char *end, int *form) {
    const char *p = *pp;
    *form = NUM_INT;
    if (p < end && *p == '-') p++;
    if (p >= end) return NEED;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < end && *p >= '0' && *p <= '9') p++; }
    else BAILR(s, "bad number");
    if (p >= end) return NEED;
    if (*p == '.') {
        *form |= NUM_FRACTION;
        p++;
        if (p >= end) return NEED;
        if (!(*p >= '0' && *p <= '9')) BAILR(s, "bad number");
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p >= end) return NEED;
    }
    if (*p == 'e' || *p == 'E') {
        *form |= NUM_EXPONENT;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end) return NEED;
        if (!(*p >= '0' && *p <= '9')) BAILR(s, "bad number");
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p >= end) return NEED;
    }
    *pp = p;
    return OK;
}

/* int64 of an integer token; 0 on overflow */
static int token_int64(const char *p, const char *e, int64_t *out) {
    int neg = 0;
    if (*p == '-') { neg = 1; p++; }
    uint64_t v = 0;
    for (; p < e; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1) return 0;
        *out = (int64_t)(0 - v);
    } else {
        if (v > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)v;
    }
    return 1;
}

static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The double nearest a validated number token. Fast path (Clinger): a significand of at most 2^53
 * (exact as a double) and no exponent, a fraction of at most 22 digits: one IEEE division by an
 * exact power of ten is then correctly rounded. Otherwise Python's own correctly rounded conversion. */
static int token_double(Scanner *s, const char *p, const char *e, double *out) {
    const char *q = p;
    int neg = 0, digits = 0, exp10 = 0;
    uint64_t m = 0;
    if (*q == '-') { neg = 1; q++; }
    while (q < e && *q >= '0' && *q <= '9') {
        if (m || *q != '0') digits++;
        m = m * 10 + (uint64_t)(*q - '0');
        q++;
        if (digits > 19) goto slow;
    }
    if (q < e && *q == '.') {
        q++;
        while (q < e && *q >= '0' && *q <= '9') {
            if (m || *q != '0') digits++;
            m = m * 10 + (uint64_t)(*q - '0');
            exp10--;
            q++;
            if (digits > 19) goto slow;
        }
    }
    if (q != e) goto slow; /* an exponent */
    if (exp10 < -22 || m > (1ULL << 53)) goto slow;
    {
        double v = (double)m;
        v = exp10 < 0 ? v / POW10[-exp10] : v;
        *out = neg ? -v : v;
        return OK;
    }
slow:;
    char tmp[80];
    Py_ssize_t n = e - p;
    if (n >= (Py_ssize_t)sizeof tmp) BAILR(s, "number token too long");
    memcpy(tmp, p, (size_t)n);
    tmp[n] = 0;
    char *stop = NULL;
    double v;
#if defined(__GLIBC__)
    if (c_locale) {
        v = strtod_l(tmp, &stop, c_locale);
    } else
#endif
    {
        /* Python's conversion (dtoa) shares state: take the GIL back for it */
        if (s->tstate) PyEval_RestoreThread(s->tstate);
        v = PyOS_string_to_double(tmp, &stop, NULL);
        int failed = v == -1.0 && PyErr_Occurred();
        if (failed) PyErr_Clear();
        if (s->tstate) s->tstate = PyEval_SaveThread();
        if (failed) BAILR(s, "bad number");
    }
    if (stop != tmp + n) BAILR(s, "bad number");
    if (Py_IS_INFINITY(v)) BAILR(s, "number out of range");
    *out = v;
    return OK;
}

static int literal(Scanner *s, const char **pp, const char *end, const char *word) {
    size_t n = word[0] == 'f' ? 5 : 4; /* true, null, false */
    const char *p = *pp;
    size_t have = (size_t)(end - p);
    if (memcmp(p, word, have < n ? have : n) != 0) BAILR(s, "bad literal");
    if (have < n) return NEED;
    *pp = p + n;
    return OK;
}

/* After a container's opening bracket at *pp: skips to its first member, or past its closing
 * bracket when it is empty (*done). */
static int open_container(Scanner *s, const char **pp, const char *end, char close, int *done) {
    const char *p = skip_ws(*pp + 1, end);
    if (p >= end) return NEED;
    *done = *p == close;
    *pp = *done ? p + 1 : p;
    return OK;
}

/* After a member: a ',' and on to the next member, or the closing bracket (*done). */
static int next_member(Scanner *s, const char **pp, const char *end, char close, int *done) {
    const char *p = skip_ws(*pp, end);
    if (p >= end) return NEED;
    if (*p == close) { *pp = p + 1; *done = 1; return OK; }
    if (*p != ',') BAILR(s, "expected ',' or a closing bracket");
    p = skip_ws(p + 1, end);
    if (p >= end) return NEED;
    *pp = p;
    *done = 0;
    return OK;
}

/* A key (string, ':') up to its value; k / kn, when asked for, is the decoded key (it may point
 * into scratch). */
static int read_key(Scanner *s, const char **pp, const char *end, const char **k, Py_ssize_t *kn) {
    const char *p = *pp, *cs, *ce;
    int esc;
    if (*p != '"') BAILR(s, "expected a key");
    CHECK(scan_string(s, &p, end, &cs, &ce, &esc));
    if (k && string_bytes(s, cs, ce, esc, k, kn) < 0) return ERR;
    p = skip_ws(p, end);
    if (p >= end) return NEED;
    if (*p != ':') BAILR(s, "expected ':'");
    p = skip_ws(p + 1, end);
    if (p >= end) return NEED;
    *pp = p;
    return OK;
}

static int skip_value(Scanner *s, const char **pp, const char *end, int depth);

static int skip_container(Scanner *s, const char **pp, const char *end, int depth, int is_obj) {
    const char *p = *pp;
    char close = is_obj ? '}' : ']';
    int done;
    if (depth > s->max_depth) BAILR(s, "nesting deeper than max_depth");
    CHECK(open_container(s, &p, end, close, &done));
    while (!done) {
        if (is_obj) CHECK(read_key(s, &p, end, NULL, NULL));
        CHECK(skip_value(s, &p, end, depth + 1));
        CHECK(next_member(s, &p, end, close, &done));
    }
    *pp = p;
    return OK;
}

static int skip_value(Scanner *s, const char **pp, const char *end, int depth) {
    const char *p = *pp;
    if (p >= end) return NEED;
    switch (*p) {
    case '{': return skip_container(s, pp, end, depth, 1);
    case '[': return skip_container(s, pp, end, depth, 0);
    case '"': { const char *cs, *ce; int esc; return scan_string(s, pp, end, &cs, &ce, &esc); }
    case 't': return literal(s, pp, end, "true");
    case 'f': return literal(s, pp, end, "false");
    case 'n': return literal(s, pp, end, "null");
    default: {
        /* skipped numbers are checked for range too (the reference decoder rejects 1e400): only an
         * exponent, or more digits than a double's range, can overflow */
        const char *start = p;
        int form;
        CHECK(scan_number(s, pp, end, &form));
        if ((form & NUM_EXPONENT) || *pp - start > 300) {
            double d;
            CHECK(token_double(s, start, *pp, &d));
        }
        return OK;
    }
    }
}

/* ------------------------------------------------------------------ one event */
typedef struct {
    int32_t ph, name, cat, pid, tid;
    double ts, dur;
    int nf;
    uint8_t fid[N_FIELDS];
    int64_t fval[N_FIELDS];
    int nodd; /* odd values, recorded in the scanner's ev_odd buffer */
    const char *shape_at[3], *shape_end[3]; /* args' "Input Dims", "Input type", "Concrete Inputs" values */
    const char *args_start, *args_end;
} Ev;


static int key_is(const char *k, Py_ssize_t n, const char *lit) {
    return (Py_ssize_t)strlen(lit) == n && memcmp(k, lit, (size_t)n) == 0;
}

/* A string value interned in table t (kind 's'). */
static int intern_string(Scanner *s, Table *t, const char **pp, const char *end, int32_t *code) {
    const char *cs, *ce, *b;
    Py_ssize_t bn;
    int esc;
    int r = scan_string(s, pp, end, &cs, &ce, &esc);
    /* a value the reference decoder decodes too (it skips others unchecked): invalid UTF-8 is final */
    if (r == BAIL && strcmp(s->reason, "invalid UTF-8") == 0) s->reason = "invalid UTF-8 in a decoded string";
    if (r != OK) return r;
    if (string_bytes(s, cs, ce, esc, &b, &bn) < 0) return ERR;
    *code = table_get(t, b, bn, 's');
    return *code < 0 ? ERR : OK;
}

/* an odd value: kind 's' (text), 'i' (an integer beyond int64), 'f' (a float), as bytes */
static int add_odd(Scanner *s, Ev *ev, int field, char kind, const char *b, Py_ssize_t n) {
    uint8_t f = (uint8_t)field;
    int64_t len = n;
    if (buf_put(&s->ev_odd, &f, 1) < 0 || buf_put(&s->ev_odd, &kind, 1) < 0 || buf_put(&s->ev_odd, &len, 8) < 0 ||
        buf_put(&s->ev_odd, b, n) < 0)
        return ERR;
    ev->nodd++;
    return OK;
}

/* A kept integer-ish field: null -> absent; int64 -> sparse value; other numbers and strings -> odd. */
static int read_int_field(Scanner *s, Ev *ev, int field, const char **pp, const char *end, int allow_float) {
    const char *p = *pp;
    if (*p == 'n') { CHECK(literal(s, pp, end, "null")); return OK; }
    if (*p == '"') {
        const char *cs, *ce, *b;
        Py_ssize_t bn;
        int esc;
        CHECK(scan_string(s, pp, end, &cs, &ce, &esc));
        if (string_bytes(s, cs, ce, esc, &b, &bn) < 0) return ERR;
        return add_odd(s, ev, field, 's', b, bn);
    }
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
        int form;
        CHECK(scan_number(s, pp, end, &form));
        int64_t v;
        if (form == NUM_INT && token_int64(p, *pp, &v)) {
            ev->fid[ev->nf] = (uint8_t)field;
            ev->fval[ev->nf++] = v;
            return OK;
        }
        if (!allow_float) BAILR(s, "an id that is not an int64");
        if (form == NUM_INT) return add_odd(s, ev, field, 'i', p, *pp - p);
        double d;
        CHECK(token_double(s, p, *pp, &d)); /* validates the range */
        return add_odd(s, ev, field, 'f', p, *pp - p);
    }
    BAILR(s, "an args field of unusual type");
}

static int parse_args(Scanner *s, Ev *ev, const char **pp, const char *end, int depth) {
    const char *p = *pp;
    unsigned seen = 0;
    int done;
    if (depth > s->max_depth) BAILR(s, "nesting deeper than max_depth");
    ev->args_start = *pp;
    CHECK(open_container(s, &p, end, '}', &done));
    while (!done) {
        const char *k;
        Py_ssize_t kn;
        CHECK(read_key(s, &p, end, &k, &kn));
        int field = -1;
        if (kn >= 3 && kn <= 19) {
            for (int i = 0; i < N_ARG_FIELDS; i++)
                if (ARG_KEY_LEN[i] == kn && memcmp(k, ARG_KEYS[i], (size_t)kn) == 0) { field = i; break; }
        }
        if (field < 0) {
            int which = kn == 10 && memcmp(k, "Input Dims", 10) == 0 ? 0
                      : kn == 10 && memcmp(k, "Input type", 10) == 0 ? 1
                      : kn == 15 && memcmp(k, "Concrete Inputs", 15) == 0 ? 2 : -1;
            const char *v0 = p;
            CHECK(skip_value(s, &p, end, depth + 1));
            if (which >= 0) { ev->shape_at[which] = v0; ev->shape_end[which] = p; }
        } else {
            if (seen & (1u << field)) BAILR(s, "a repeated args key");
            seen |= 1u << field;
            if (field == F_NAME) {
                if (*p == 'n') CHECK(literal(s, &p, end, "null"));
                else if (*p == '"') {
                    int32_t code;
                    CHECK(intern_string(s, &s->strings, &p, end, &code));
                    ev->fid[ev->nf] = F_NAME;
                    ev->fval[ev->nf++] = code;
                } else BAILR(s, "args name of unusual type");
            } else if (IS_STRING_FIELD(field)) {
                /* collective metadata: a string is kept; anything else is ignored, as by the reference */
                if (*p == '"') {
                    int32_t code;
                    CHECK(intern_string(s, &s->strings, &p, end, &code));
                    ev->fid[ev->nf] = (uint8_t)field;
                    ev->fval[ev->nf++] = code;
                } else CHECK(skip_value(s, &p, end, depth + 1));
            } else {
                CHECK(read_int_field(s, ev, field, &p, end, 1));
            }
        }
        CHECK(next_member(s, &p, end, '}', &done));
    }
    *pp = ev->args_end = p;
    return OK;
}

static int read_ident(Scanner *s, const char **pp, const char *end, int32_t *code) {
    const char *p = *pp;
    if (*p == '"') return intern_string(s, &s->idents, pp, end, code);
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
        int form;
        int64_t v;
        CHECK(scan_number(s, pp, end, &form));
        if (form != NUM_INT || !token_int64(p, *pp, &v)) BAILR(s, "pid/tid that is not an int64 or a string");
        *code = table_get(&s->idents, (const char *)&v, sizeof v, 'i');
        return *code < 0 ? ERR : OK;
    }
    BAILR(s, "pid/tid of unusual type");
}

static int read_double(Scanner *s, const char **pp, const char *end, double *out) {
    const char *p = *pp;
    if (!(*p == '-' || (*p >= '0' && *p <= '9'))) BAILR(s, "ts/dur that is not a number");
    int form;
    CHECK(scan_number(s, pp, end, &form));
    return token_double(s, p, *pp, out);
}

enum { K_PH = 1, K_NAME = 2, K_CAT = 4, K_TS = 8, K_DUR = 16, K_PID = 32, K_TID = 64, K_ID = 128, K_ARGS = 256 };

static int parse_event_body(Scanner *s, Ev *ev, const char **pp, const char *end, int depth) {
    const char *p = *pp;
    unsigned seen = 0;
    int done;
    if (depth > s->max_depth) BAILR(s, "nesting deeper than max_depth");
    CHECK(open_container(s, &p, end, '}', &done));
    while (!done) {
        const char *k;
        Py_ssize_t kn;
        CHECK(read_key(s, &p, end, &k, &kn));
        unsigned kbit = 0;
        switch (kn) {
        case 2:
            if (k[0] == 'p' && k[1] == 'h') kbit = K_PH;
            else if (k[0] == 't' && k[1] == 's') kbit = K_TS;
            else if (k[0] == 'i' && k[1] == 'd') kbit = K_ID;
            break;
        case 3:
            if (memcmp(k, "cat", 3) == 0) kbit = K_CAT;
            else if (memcmp(k, "dur", 3) == 0) kbit = K_DUR;
            else if (memcmp(k, "pid", 3) == 0) kbit = K_PID;
            else if (memcmp(k, "tid", 3) == 0) kbit = K_TID;
            break;
        case 4:
            if (memcmp(k, "name", 4) == 0) kbit = K_NAME;
            else if (memcmp(k, "args", 4) == 0) kbit = K_ARGS;
            break;
        }
        if (kbit & seen) BAILR(s, "a repeated event key");
        seen |= kbit;
        switch (kbit) {
        case K_PH: case K_NAME: case K_CAT: {
            if (*p != '"') BAILR(s, "ph/name/cat that is not a string");
            int32_t code;
            CHECK(intern_string(s, &s->strings, &p, end, &code));
            if (kbit == K_PH) ev->ph = code; else if (kbit == K_NAME) ev->name = code; else ev->cat = code;
            break;
        }
        case K_TS: CHECK(read_double(s, &p, end, &ev->ts)); break;
        case K_DUR: CHECK(read_double(s, &p, end, &ev->dur)); break;
        case K_PID: CHECK(read_ident(s, &p, end, &ev->pid)); break;
        case K_TID: CHECK(read_ident(s, &p, end, &ev->tid)); break;
        case K_ID: CHECK(read_int_field(s, ev, F_ID, &p, end, 0)); break;
        case K_ARGS:
            if (*p == 'n') CHECK(literal(s, &p, end, "null"));
            else if (*p == '{') CHECK(parse_args(s, ev, &p, end, depth + 1));
            else BAILR(s, "args that is not an object");
            break;
        default: CHECK(skip_value(s, &p, end, depth + 1));
        }
        CHECK(next_member(s, &p, end, '}', &done));
    }
    *pp = p;
    return OK;
}

/* counter rows from a committed "C" event's args (already validated: no NEED or BAIL here) */
static int counter_rows(Scanner *s, Ev *ev) {
    const char *p = ev->args_start, *end = ev->args_end;
    int64_t idx = s->n;
    int done;
    CHECK(open_container(s, &p, end, '}', &done));
    while (!done) {
        const char *k;
        Py_ssize_t kn;
        CHECK(read_key(s, &p, end, &k, &kn));
        int32_t code = table_get(&s->strings, k, kn, 's');
        if (code < 0) return ERR;
        const char *v = p;
        if (*p == '-' || (*p >= '0' && *p <= '9')) {
            int form;
            double d;
            CHECK(scan_number(s, &p, end, &form));
            CHECK(token_double(s, v, p, &d));
            if (buf_put(&s->c_event, &idx, 8) < 0 || buf_put(&s->c_series, &code, 4) < 0 ||
                buf_put(&s->c_value, &d, 8) < 0)
                return ERR;
        } else {
            CHECK(skip_value(s, &p, end, 0));
        }
        CHECK(next_member(s, &p, end, '}', &done));
    }
    return OK;
}

static int commit(Scanner *s, Ev *ev) {
    int32_t ph = ev->ph < 0 ? s->code_empty : ev->ph;
    int32_t name = ev->name < 0 ? s->code_empty : ev->name;
    int32_t cat = ev->cat < 0 ? s->code_empty : ev->cat;
    int32_t pid = ev->pid < 0 ? s->ident_empty : ev->pid;
    int32_t tid = ev->tid < 0 ? s->ident_empty : ev->tid;
    int64_t idx = s->n;
    if (ph == s->code_C && ev->args_start) {
        int r = counter_rows(s, ev);
        if (r != OK) return r;
    }
    if (cat == s->code_mark && ev->args_start) { /* validated already: handed to Python whole */
        int64_t len = ev->args_end - ev->args_start;
        if (buf_put(&s->marks, &idx, 8) < 0 || buf_put(&s->marks, &len, 8) < 0 ||
            buf_put(&s->marks, ev->args_start, len) < 0)
            return ERR;
    }
    if (ev->shape_at[0] && (cat == s->code_cpu_op || cat == s->code_operator)) {
        if (buf_put(&s->shapes, &idx, 8) < 0) return ERR;
        for (int j = 0; j < 3; j++) {
            int64_t len = ev->shape_at[j] ? ev->shape_end[j] - ev->shape_at[j] : -1;
            if (buf_put(&s->shapes, &len, 8) < 0 || (len > 0 && buf_put(&s->shapes, ev->shape_at[j], len) < 0))
                return ERR;
        }
    }
    if (buf_put(&s->ph, &ph, 4) < 0 || buf_put(&s->name, &name, 4) < 0 || buf_put(&s->cat, &cat, 4) < 0 ||
        buf_put(&s->pid, &pid, 4) < 0 || buf_put(&s->tid, &tid, 4) < 0 || buf_put(&s->ts, &ev->ts, 8) < 0 ||
        buf_put(&s->dur, &ev->dur, 8) < 0)
        return ERR;
    for (int i = 0; i < ev->nf; i++) {
        if (buf_put(&s->f_event, &idx, 8) < 0 || buf_put(&s->f_id, &ev->fid[i], 1) < 0 ||
            buf_put(&s->f_value, &ev->fval[i], 8) < 0)
            return ERR;
    }
    if (ev->nodd) { /* each record: event, then the field/kind/length/bytes written by add_odd */
        const char *q = s->ev_odd.data, *qe = q + s->ev_odd.len;
        while (q < qe) {
            int64_t len;
            memcpy(&len, q + 2, 8);
            if (buf_put(&s->odd, &idx, 8) < 0 || buf_put(&s->odd, q, 10 + len) < 0) return ERR;
            q += 10 + len;
        }
    }
    s->n++;
    return OK;
}

static int parse_event(Scanner *s, const char **pp, const char *end) {
    Ev ev;
    ev.ph = ev.name = ev.cat = ev.pid = ev.tid = -1;
    ev.ts = Py_NAN;
    ev.dur = 0.0;
    ev.nf = ev.nodd = 0;
    ev.args_start = ev.args_end = NULL;
    ev.shape_at[0] = ev.shape_at[1] = ev.shape_at[2] = NULL;
    s->ev_odd.len = 0;
    if (**pp != '{') { s->reason = "an item of traceEvents that is not an object"; return BAIL; }
    int r = parse_event_body(s, &ev, pp, end, s->bare ? 1 : 2);
    if (r == OK) r = commit(s, &ev);
    return r;
}

/* ------------------------------------------------------------------ the state machine */
static int step(Scanner *s, const char **pp, const char *end) {
    const char *p = skip_ws(*pp, end);
    *pp = p; /* whitespace between units is always consumed */
    if (p >= end) return NEED;
    switch (s->state) {
    case ST_START:
        if (*p == '{') { s->state = ST_TOP_KEY_FIRST; *pp = p + 1; return OK; }
        if (*p == '[') { s->bare = 1; s->seen_events = 1; s->state = ST_EV_FIRST; *pp = p + 1; return OK; }
        BAILR(s, "not a JSON object or array");
    case ST_TOP_KEY_FIRST:
    case ST_TOP_KEY: {
        if (s->state == ST_TOP_KEY_FIRST && *p == '}') { s->state = ST_DONE; *pp = p + 1; return OK; }
        const char *k;
        Py_ssize_t kn;
        CHECK(read_key(s, &p, end, &k, &kn));
        if (key_is(k, kn, "traceEvents")) {
            if (s->seen_events) BAILR(s, "traceEvents twice");
            if (*p != '[') { /* skipped: with repeated keys the last one counts, as for a JSON decoder */
                CHECK(skip_value(s, &p, end, 2));
                s->events_not_list = 1;
                s->state = ST_TOP_AFTER;
                *pp = p;
                return OK;
            }
            s->seen_events = 1;
            s->state = ST_EV_FIRST;
            *pp = p + 1;
            return OK;
        }
        int64_t klen = kn;
        Py_ssize_t mark = s->meta.len;
        if (buf_put(&s->meta, &klen, 8) < 0 || buf_put(&s->meta, k, kn) < 0) return ERR;
        const char *v = p;
        int r = skip_value(s, &p, end, 2);
        if (r != OK) { s->meta.len = mark; return r; }
        int64_t vlen = p - v;
        if (s->meta.len + vlen > META_MAX_BYTES) { s->meta.len = mark; BAILR(s, "top-level metadata over 4 MiB"); }
        if (buf_put(&s->meta, &vlen, 8) < 0 || buf_put(&s->meta, v, vlen) < 0) return ERR;
        s->state = ST_TOP_AFTER;
        *pp = p;
        return OK;
    }
    case ST_TOP_AFTER:
        if (*p == ',') { s->state = ST_TOP_KEY; *pp = p + 1; return OK; }
        if (*p == '}') { s->state = ST_DONE; *pp = p + 1; return OK; }
        BAILR(s, "expected ',' or '}' at the top level");
    case ST_EV_FIRST:
    case ST_EV_NEXT:
        if (s->state == ST_EV_FIRST && *p == ']') {
            s->state = s->bare ? ST_DONE : ST_TOP_AFTER;
            *pp = p + 1;
            return OK;
        }
        CHECK(parse_event(s, &p, end));
        s->state = ST_EV_AFTER;
        *pp = p;
        return OK;
    case ST_EV_AFTER:
        if (*p == ',') { s->state = ST_EV_NEXT; *pp = p + 1; return OK; }
        if (*p == ']') { s->state = s->bare ? ST_DONE : ST_TOP_AFTER; *pp = p + 1; return OK; }
        BAILR(s, "expected ',' or ']' in traceEvents");
    case ST_DONE:
    default:
        BAILR(s, "data after the JSON document");
    }
}

static PyObject *Scanner_feed(Scanner *s, PyObject *args) {
    Py_buffer view;
    int final;
    if (!PyArg_ParseTuple(args, "y*p", &view, &final)) return NULL;
    const char *start = view.buf, *p = start, *end = start + view.len;
    int r = OK;
    if (s->busy) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "Scanner.feed called from two threads at once");
        return NULL;
    }
    if (s->reason) { PyBuffer_Release(&view); return PyLong_FromLong(-1); }
    if (s->at_bof) { /* a byte-order mark some editors add, at the very first byte only */
        static const char bom[3] = {'\xEF', '\xBB', '\xBF'};
        Py_ssize_t have = end - p < 3 ? end - p : 3;
        if (memcmp(p, bom, (size_t)have) == 0) {
            if (have < 3 && !final) { PyBuffer_Release(&view); return PyLong_FromLong(0); }
            if (have == 3) p += 3;
        }
        s->at_bof = 0;
    }
    s->busy = 1;
    s->tstate = PyEval_SaveThread(); /* scanning touches no Python object: other threads run meanwhile */
    while (r == OK) {
        const char *q = p;
        r = step(s, &q, end);
        if (r == OK || r == NEED) p = q; /* a unit cut by the chunk's end restarts from its first byte */
        /* a profiler's events take 50+ bytes of JSON; columns cost ~40-80 bytes an event: a file of tiny
         * items would outgrow itself in memory many times over */
        if (r == OK && s->n > MIN_EVENT_CHECK_AFTER && (s->n & 0xFFFF) == 0 &&
            s->consumed + (p - start) < (int64_t)MIN_EVENT_BYTES * s->n) {
            s->reason = "events average under 24 bytes";
            r = BAIL;
        }
    }
    s->consumed += p - start;
    PyEval_RestoreThread(s->tstate);
    s->tstate = NULL;
    s->busy = 0;
    PyBuffer_Release(&view);
    if (r == ERR) return PyErr_NoMemory();
    if (r == BAIL) return PyLong_FromLong(-1);
    /* NEED: everything up to p is consumed */
    if (final && (s->state != ST_DONE || !s->seen_events)) {
        /* nothing at all / a document cut short / a complete JSON document without traceEvents */
        s->reason = s->state == ST_START ? "the document is empty"
                    : s->state != ST_DONE ? "the document ends early"
                    : s->events_not_list ? "traceEvents is not a list" : "a JSON document without traceEvents";
        return PyLong_FromLong(-1);
    }
    return PyLong_FromSsize_t(p - start);
}

/* the buffer as bytes, freed at once so that finishing never holds two copies of every column */
static PyObject *bytes_of(Buf *b) {
    PyObject *o = PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
    buf_free(b);
    return o;
}

static PyObject *table_values(Table *t) {
    PyObject *list = PyList_New(t->count);
    if (!list) return NULL;
    const Py_ssize_t *offs = (const Py_ssize_t *)t->index.data;
    for (int32_t c = 0; c < t->count; c++) {
        Py_ssize_t off = offs[c];
        Py_ssize_t end = c + 1 < t->count ? offs[c + 1] : t->arena.len;
        const char *key = t->arena.data + off;
        PyObject *v;
        if (key[0] == 's') {
            v = PyUnicode_DecodeUTF8(key + 1, end - off - 1, "strict");
        } else {
            int64_t x;
            memcpy(&x, key + 1, sizeof x);
            v = PyLong_FromLongLong(x);
        }
        if (!v) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, c, v);
    }
    return list;
}

static PyObject *odd_values(Buf *b) {
    PyObject *list = PyList_New(0);
    const char *q = b->data, *qe = q + b->len;
    while (list && q < qe) {
        int64_t idx, len;
        memcpy(&idx, q, 8);
        uint8_t field = (uint8_t)q[8];
        char kind = q[9];
        memcpy(&len, q + 10, 8);
        const char *v = q + 18;
        PyObject *obj;
        if (kind == 's') {
            obj = PyUnicode_DecodeUTF8(v, len, "strict");
        } else {
            PyObject *text = PyUnicode_DecodeASCII(v, len, "strict");
            obj = !text ? NULL : kind == 'i' ? PyLong_FromUnicodeObject(text, 10) : PyFloat_FromString(text);
            Py_XDECREF(text);
        }
        PyObject *t = obj ? Py_BuildValue("(LiN)", (long long)idx, (int)field, obj) : NULL;
        if (!t || PyList_Append(list, t) < 0) { Py_XDECREF(t); Py_CLEAR(list); break; }
        Py_DECREF(t);
        q += 18 + len;
    }
    return list;
}

static PyObject *meta_items(Buf *b) {
    PyObject *list = PyList_New(0);
    const char *q = b->data, *qe = q + b->len;
    while (list && q < qe) {
        int64_t klen, vlen;
        memcpy(&klen, q, 8);
        const char *k = q + 8;
        memcpy(&vlen, k + klen, 8);
        const char *v = k + klen + 8;
        PyObject *t = Py_BuildValue("(s#y#)", k, (Py_ssize_t)klen, v, (Py_ssize_t)vlen);
        if (!t || PyList_Append(list, t) < 0) { Py_XDECREF(t); Py_CLEAR(list); break; }
        Py_DECREF(t);
        q = v + vlen;
    }
    return list;
}

static PyObject *mark_items(Buf *b) {
    PyObject *list = PyList_New(0);
    const char *q = b->data, *qe = q + b->len;
    while (list && q < qe) {
        int64_t idx, len;
        memcpy(&idx, q, 8);
        memcpy(&len, q + 8, 8);
        PyObject *t = Py_BuildValue("(Ly#)", (long long)idx, q + 16, (Py_ssize_t)len);
        if (!t || PyList_Append(list, t) < 0) { Py_XDECREF(t); Py_CLEAR(list); break; }
        Py_DECREF(t);
        q += 16 + len;
    }
    buf_free(b);
    return list;
}

/* (event, (dims, types, concrete)) per op; a value not written is None; texts repeat, so each distinct one is made
 * once (a dict of the texts seen) */
static PyObject *shape_items(Buf *b) {
    PyObject *list = PyList_New(0), *seen = PyDict_New();
    const char *q = b->data, *qe = q + b->len;
    while (list && seen && q < qe) {
        int64_t idx;
        memcpy(&idx, q, 8);
        q += 8;
        PyObject *vals[3] = {NULL, NULL, NULL};
        int ok = 1;
        for (int j = 0; j < 3; j++) {
            int64_t len;
            memcpy(&len, q, 8);
            q += 8;
            if (len < 0) { vals[j] = Py_NewRef(Py_None); continue; }
            PyObject *text = PyUnicode_DecodeUTF8(q, (Py_ssize_t)len, "strict");
            q += len;
            if (!text) { ok = 0; break; }
            PyObject *known = PyDict_SetDefault(seen, text, text);
            vals[j] = known ? Py_NewRef(known) : NULL;
            Py_DECREF(text);
            if (!vals[j]) { ok = 0; break; }
        }
        PyObject *t = ok ? Py_BuildValue("(L(OOO))", (long long)idx, vals[0], vals[1], vals[2]) : NULL;
        for (int j = 0; j < 3; j++) Py_XDECREF(vals[j]);
        if (!t) { Py_CLEAR(list); break; }
        if (PyList_Append(list, t) < 0) Py_CLEAR(list);
        Py_DECREF(t);
    }
    Py_XDECREF(seen);
    if (!seen) Py_CLEAR(list);
    buf_free(b);
    return list;
}

static PyObject *Scanner_finish(Scanner *s, PyObject *Py_UNUSED(ignored)) {
    if (s->busy) { PyErr_SetString(PyExc_RuntimeError, "Scanner.finish called during feed"); return NULL; }
    PyObject *d = Py_BuildValue(
        "{s:n,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N}",
        "n", s->n, "ph", bytes_of(&s->ph), "name", bytes_of(&s->name), "cat", bytes_of(&s->cat),
        "ts", bytes_of(&s->ts), "dur", bytes_of(&s->dur), "pid", bytes_of(&s->pid), "tid", bytes_of(&s->tid),
        "strings", table_values(&s->strings), "idents", table_values(&s->idents), "f_event", bytes_of(&s->f_event),
        "f_id", bytes_of(&s->f_id), "f_value", bytes_of(&s->f_value), "odd", odd_values(&s->odd),
        "c_event", bytes_of(&s->c_event), "c_series", bytes_of(&s->c_series), "c_value", bytes_of(&s->c_value),
        "meta", meta_items(&s->meta), "marks", mark_items(&s->marks), "shapes", shape_items(&s->shapes));
    return d;
}

static PyObject *Scanner_get_n(Scanner *s, void *c) { return PyLong_FromSsize_t(s->n); }
static PyObject *Scanner_get_at_item(Scanner *s, void *c) { return PyBool_FromLong(s->state == ST_EV_NEXT); }
static PyObject *Scanner_get_reason(Scanner *s, void *c) {
    if (!s->reason) Py_RETURN_NONE;
    return PyUnicode_FromString(s->reason);
}

static void Scanner_dealloc(Scanner *s) {
    table_free(&s->strings);
    table_free(&s->idents);
    Buf *bufs[] = {&s->ph, &s->name, &s->cat, &s->ts, &s->dur, &s->pid, &s->tid, &s->f_event, &s->f_id,
                   &s->f_value, &s->c_event, &s->c_series, &s->c_value, &s->scratch, &s->ev_odd, &s->odd, &s->meta,
                   &s->marks, &s->shapes};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) buf_free(bufs[i]);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int Scanner_init(Scanner *s, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"max_depth", "resume", NULL};
    int max_depth = 512, resume = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|ii", kwlist, &max_depth, &resume)) return -1;
    if (s->strings.slots) { PyErr_SetString(PyExc_RuntimeError, "Scanner already initialised"); return -1; }
    s->max_depth = max_depth;
    s->state = ST_START;
    s->at_bof = !resume;
    if (resume) { /* start at an item of traceEvents (1: inside the top-level object, 2: a bare array) */
        s->state = ST_EV_NEXT;
        s->seen_events = 1;
        s->bare = resume == 2;
    }
    if (table_init(&s->strings) < 0 || table_init(&s->idents) < 0) { PyErr_NoMemory(); return -1; }
    s->code_empty = table_get(&s->strings, "", 0, 's');
    s->code_C = table_get(&s->strings, "C", 1, 's');
    s->code_mark = table_get(&s->strings, "kinetoscope", 11, 's');
    s->code_cpu_op = table_get(&s->strings, "cpu_op", 6, 's');
    s->code_operator = table_get(&s->strings, "Operator", 8, 's');
    s->ident_empty = table_get(&s->idents, "", 0, 's');
    if (s->code_empty < 0 || s->code_C < 0 || s->code_mark < 0 || s->code_cpu_op < 0 ||
        s->code_operator < 0 || s->ident_empty < 0) { PyErr_NoMemory(); return -1; }
    return 0;
}

static PyMethodDef Scanner_methods[] = {
    {"feed", (PyCFunction)Scanner_feed, METH_VARARGS,
     "feed(data, final) -> bytes consumed, or -1 when the document needs the reference decoder"},
    {"finish", (PyCFunction)Scanner_finish, METH_NOARGS, "the columns, tables and metadata scanned so far"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Scanner_getset[] = {
    {"n", (getter)Scanner_get_n, NULL, "events scanned", NULL},
    {"at_item", (getter)Scanner_get_at_item, NULL, "whether the next byte must start an item of traceEvents", NULL},
    {"reason", (getter)Scanner_get_reason, NULL, "why the scanner gave up, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kinetoscope.analyze._scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Resumable columnar scanner for Kineto trace JSON",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
    .tp_getset = Scanner_getset,
};

static struct PyModuleDef scanmodule = {PyModuleDef_HEAD_INIT, "_scan", "Columnar Kineto trace scanner", -1, NULL};

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&ScannerType) < 0) return NULL;
#if defined(__GLIBC__)
    if (!c_locale) c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
#endif
    PyObject *m = PyModule_Create(&scanmodule);
    if (!m) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
