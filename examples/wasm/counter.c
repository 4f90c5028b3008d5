/* counter: the native counter's protocol as a module. POST /o/<app>/<name> adds one (or the
 * whole number in the body, e.g. 5 or -2) and answers {"value":n} once committed; GET answers
 * the value; a session's message gets the value sent back. Requests waiting together are
 * handled in one transaction (a batch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "combd.h"

COMBD_EXPORT("schema") const char *schema(void) {
    return "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 1), "
           "value INTEGER NOT NULL);"
           "INSERT OR IGNORE INTO counter (id, value) VALUES (1, 0);";
}

static int fail(int status, const char *msg) {
    combd_fail(status, msg, (int32_t)strlen(msg));
    return -1;
}

/* The amount in the body: 1 if empty, else a whole number (spaces around it allowed). */
static int amount(long long *by) {
    char body[32];
    int32_t n = combd_input(COMBD_BODY, body, sizeof body - 1);
    if (n <= 0) return (*by = 1), 0;
    if (n > (int32_t)sizeof body - 1) return -1;
    body[n] = 0;
    char *end;
    *by = strtoll(body, &end, 10);
    while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t') end++;
    return end == body || *end ? -1 : 0;
}

/* Runs `sql` (with the parameters bound) and formats {"value":<first column>}. */
static int value_json(const char *sql, char *json, int cap) {
    if (combd_sql(sql, (int32_t)strlen(sql)) != 1) return fail(500, "storage");
    return snprintf(json, cap, "{\"value\":%lld}", (long long)combd_sql_int(0, 0));
}

static int answer(void) {
    static const char read[] = "SELECT value FROM counter WHERE id = 1";
    char json[48], method[8] = {0};
    int n;
    switch (combd_kind()) {
    case COMBD_HTTP:
        combd_input(COMBD_METHOD, method, sizeof method - 1);
        if (!strcmp(method, "POST")) {
            long long by;
            if (amount(&by) < 0) return fail(400, "the body must be a whole number");
            combd_bind_int(by);
            n = value_json("UPDATE counter SET value = value + ?1 WHERE id = 1 RETURNING value",
                           json, sizeof json);
        } else if (!strcmp(method, "GET") || !strcmp(method, "HEAD")) {
            n = value_json(read, json, sizeof json);
        } else {
            return fail(405, "GET the value or POST to add");
        }
        if (n < 0) return -1;
        combd_respond(200, json, n);
        return 0;
    case COMBD_TEXT:
    case COMBD_BINARY:
        if ((n = value_json(read, json, sizeof json)) < 0) return -1;
        combd_send(combd_session_shard(), combd_session_id(), json, n);
        return 0;
    default:
        return 0;
    }
}

COMBD_EXPORT("handle") int handle(void) { return answer() < 0; }

COMBD_EXPORT("handle_batch") int handle_batch(int n) {
    for (int i = 0; i < n; i++) {
        combd_select(i);
        if (answer() < 0) return 1;
    }
    return 0;
}
