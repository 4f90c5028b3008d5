/* counter: the durable counter as a module. POST /o/<app>/<name> adds one and answers
 * {"value":n}; GET answers the value. Waiting requests are handled in one transaction. */
#include <stdio.h>
#include <string.h>

#include "combd.h"

COMBD_EXPORT("schema") const char *schema(void) {
    return "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 1), "
           "value INTEGER NOT NULL);"
           "INSERT OR IGNORE INTO counter VALUES (1, 0);";
}

static int sql(const char *s) { return combd_sql(s, (int32_t)strlen(s)); }

static void answer(void) {
    char method[8] = {0};
    if (combd_kind() != COMBD_HTTP) return;
    combd_input(COMBD_METHOD, method, sizeof method - 1);
    int rows;
    if (strcmp(method, "POST") == 0)
        rows = sql("UPDATE counter SET value = value + 1 RETURNING value");
    else if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0)
        rows = sql("SELECT value FROM counter");
    else {
        static const char msg[] = "POST to count, GET to read";
        combd_fail(405, msg, sizeof msg - 1);
        return;
    }
    char json[48];
    int n = snprintf(json, sizeof json, "{\"value\":%lld}",
                     rows == 1 ? (long long)combd_sql_int(0, 0) : 0LL);
    combd_respond(200, json, n);
}

COMBD_EXPORT("handle") int handle(void) {
    answer();
    return 0;
}

COMBD_EXPORT("handle_batch") int handle_batch(int n) {
    for (int i = 0; i < n; i++) {
        combd_select(i);
        answer();
    }
    return 0;
}
