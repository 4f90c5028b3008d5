/* million: the board of 1,000,000 checkboxes as a module, speaking the native app's protocol
 * (src/apps/million.rs): GET /o/<app>/<board>?page=<p> upgrades to a viewer of page p, whose
 * first message is {"t":"page","p":p,"s":<session>,"bits":"<hex>"}; a click
 * {"t":"click","i":<box>,"c":<seq>} toggles a box and every viewer of its page gets
 * {"t":"set","u":[[i,v,session,c],...]}. Clicks waiting together are applied in one
 * transaction, one read, one write and one update per page. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "combd.h"

#define BOXES 1000000
#define PAGE_BOXES 4096
#define PAGES ((BOXES + PAGE_BOXES - 1) / PAGE_BOXES)
#define PAGE_BYTES (PAGE_BOXES / 8)
#define MAX_CLICKS 128

COMBD_EXPORT("schema") const char *schema(void) {
    return "CREATE TABLE IF NOT EXISTS pages (page INTEGER PRIMARY KEY, bits BLOB NOT NULL);";
}

/* A viewer that missed updates is attached again: its attach sends the page whole. */
COMBD_EXPORT("resync") int resync(void) { return 1; }

static int fail(int status, const char *msg) {
    combd_fail(status, msg, (int32_t)strlen(msg));
    return -1;
}

/* The page in a query (page=<p>, default 0), or -1 after failing the input. */
static long page_of_query(void) {
    static char q[1024];
    int32_t n = combd_input(COMBD_QUERY, q, sizeof q - 1);
    if (n < 0) return 0;
    if (n > (int32_t)sizeof q - 1) return fail(400, "page must be a whole number");
    q[n] = 0;
    for (char *kv = q; kv; kv = strchr(kv, '&') ? strchr(kv, '&') + 1 : NULL) {
        if (strncmp(kv, "page=", 5) != 0) continue;
        char *v = kv + 5, *end = v;
        long p = 0;
        while (*end >= '0' && *end <= '9' && p < 1000000) p = p * 10 + (*end++ - '0');
        if (end == v || (*end && *end != '&')) return fail(400, "page must be a whole number");
        if (p >= PAGES) {
            char msg[64];
            snprintf(msg, sizeof msg, "page must be below %d", PAGES);
            return fail(400, msg);
        }
        return p;
    }
    return 0;
}

static uint64_t session_number(void) {
    return ((uint64_t)combd_session_shard() << 40) |
           ((uint64_t)combd_session_id() & ((1ULL << 40) - 1));
}

static void load_page(long page, uint8_t bits[PAGE_BYTES]) {
    static const char q[] = "SELECT bits FROM pages WHERE page = ?1";
    memset(bits, 0, PAGE_BYTES);
    combd_bind_int(page);
    if (combd_sql(q, sizeof q - 1) == 1) combd_sql_text(0, 0, bits, PAGE_BYTES);
}

struct click { long i; uint64_t c, session; };
static struct click clicks[MAX_CLICKS];
static int nclicks;

/* Sorts the clicks by page, keeping their order within a page (an insertion sort: stable). */
static void sort_by_page(void) {
    for (int k = 1; k < nclicks; k++) {
        struct click c = clicks[k];
        int j = k;
        for (; j > 0 && clicks[j - 1].i / PAGE_BOXES > c.i / PAGE_BOXES; j--) clicks[j] = clicks[j - 1];
        clicks[j] = c;
    }
}

/* Applies the clicks waiting, grouped by page: one read, one write, one broadcast each. */
static int apply(void) {
    static const char w[] = "INSERT OR REPLACE INTO pages (page, bits) VALUES (?1, ?2)";
    static char json[64 + MAX_CLICKS * 64];
    static uint8_t bits[PAGE_BYTES];
    sort_by_page();
    for (int k = 0; k < nclicks;) {
        long page = clicks[k].i / PAGE_BOXES;
        load_page(page, bits);
        int len = snprintf(json, sizeof json, "{\"t\":\"set\",\"u\":[");
        for (int first = 1; k < nclicks && clicks[k].i / PAGE_BOXES == page; k++, first = 0) {
            long off = clicks[k].i % PAGE_BOXES;
            bits[off / 8] ^= (uint8_t)(1 << (off % 8));
            int v = (bits[off / 8] >> (off % 8)) & 1;
            len += snprintf(json + len, sizeof json - len, "%s[%ld,%d,%llu,%llu]", first ? "" : ",",
                            clicks[k].i, v, (unsigned long long)clicks[k].session,
                            (unsigned long long)clicks[k].c);
        }
        len += snprintf(json + len, sizeof json - len, "]}");
        combd_bind_int(page);
        combd_bind_blob(bits, PAGE_BYTES);
        if (combd_sql(w, sizeof w - 1) < 0) return fail(500, "storage");
        char topic[16];
        int tn = snprintf(topic, sizeof topic, "p%ld", page);
        combd_broadcast(topic, tn, json, len);
    }
    nclicks = 0;
    return 0;
}

/* The number after "key": in a JSON object, or -1. */
static long long number_at(const char *s, const char *key) {
    const char *p = strstr(s, key);
    if (!p) return -1;
    p += strlen(key);
    while (*p == ' ') p++;
    if (*p < '0' || *p > '9') return -1;
    long long v = 0;
    while (*p >= '0' && *p <= '9' && v < 100000000000LL) v = v * 10 + (*p++ - '0');
    return v;
}

/* Queues the current input's click, or fails it. */
static int queue_click(void) {
    static char m[1024];
    if (combd_kind() != COMBD_TEXT) return fail(400, "clicks are text messages");
    int32_t n = combd_input(COMBD_BODY, m, sizeof m - 1);
    if (n < 0 || n > (int32_t)sizeof m - 1 || m[0] != '{') return fail(400, "a click is JSON");
    m[n] = 0;
    if (!strstr(m, "\"t\":\"click\"")) return fail(400, "unknown message type");
    long long i = number_at(m, "\"i\":");
    if (i < 0) return fail(400, "i must be a box index");
    if (i >= BOXES) return fail(400, "i must be below 1000000");
    long long c = number_at(m, "\"c\":");
    if (nclicks == MAX_CLICKS && apply() < 0) return -1;
    clicks[nclicks++] = (struct click){(long)i, c < 0 ? 0 : (uint64_t)c, session_number()};
    return 0;
}

static int answer(void) {
    switch (combd_kind()) {
    case COMBD_HTTP: {
        char method[8] = {0};
        combd_input(COMBD_METHOD, method, sizeof method - 1);
        if (strcmp(method, "GET") && strcmp(method, "HEAD"))
            return fail(405, "view the board over a WebSocket");
        if (page_of_query() < 0) return -1;
        char json[96];
        int n = snprintf(json, sizeof json, "{\"boxes\":%d,\"page_boxes\":%d,\"pages\":%d}", BOXES,
                         PAGE_BOXES, PAGES);
        combd_respond(200, json, n);
        return 0;
    }
    case COMBD_ATTACH: {
        static uint8_t bits[PAGE_BYTES];
        static char msg[128 + PAGE_BYTES * 2];
        static const char hex[] = "0123456789abcdef";
        long page = page_of_query();
        if (page < 0) return -1;
        load_page(page, bits);
        int n = snprintf(msg, sizeof msg, "{\"t\":\"page\",\"p\":%ld,\"s\":%llu,\"bits\":\"", page,
                         (unsigned long long)session_number());
        for (int k = 0; k < PAGE_BYTES; k++) {
            msg[n++] = hex[bits[k] >> 4];
            msg[n++] = hex[bits[k] & 15];
        }
        n += snprintf(msg + n, sizeof msg - n, "\"}");
        combd_send(combd_session_shard(), combd_session_id(), msg, n);
        return 0;
    }
    case COMBD_DETACH:
        return 0;
    default:
        if (queue_click() < 0) return -1;
        return apply();
    }
}

COMBD_EXPORT("topic") const char *topic(void) {
    static char t[16];
    long page = page_of_query();
    if (page < 0) return 0;
    snprintf(t, sizeof t, "p%ld", page);
    return t;
}

COMBD_EXPORT("handle") int handle(void) { return answer() < 0; }

/* Attaches and reads in order; clicks applied together. Any bad input fails the batch, which
 * the node then retries one input at a time. */
COMBD_EXPORT("handle_batch") int handle_batch(int n) {
    nclicks = 0;
    for (int k = 0; k < n; k++) {
        int kind = combd_select(k);
        if (kind == COMBD_TEXT || kind == COMBD_BINARY) {
            if (queue_click() < 0) return 1;
            continue;
        }
        if (nclicks && apply() < 0) return 1;
        if (answer() < 0) return 1;
    }
    return nclicks && apply() < 0;
}
