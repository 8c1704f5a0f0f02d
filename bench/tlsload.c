/*
 * tlsload: a small native TLS load generator for the certagent benchmark.
 *
 * Why it exists: the bench runs on 2 vCPUs.  The pure-Python storm client
 * (bench/_load.py, asyncio + ssl) needs a whole core to drive a few hundred
 * concurrent handshakes, so it competes with HAProxy for the CPUs and its own
 * scheduling delays end up in the latencies it reports.  This program does the
 * same handshakes from one epoll loop in C, at a small fraction of the CPU.
 * bench/_native.py builds it, feeds it and parses its output.
 *
 * Every handshake is verified like the Python client's: OpenSSL 3 client,
 * TLS 1.2 or newer, the bench root as the only trust anchor, SNI and hostname
 * checking on, and never a resumed session.  A host that gets HAProxy's
 * default certificate therefore fails, as "not verified (default certificate)"
 * (the Python generator's error key).
 *
 * Usage:
 *   tlsload storm --port P --cafile F --concurrency C --spread S [--timeout T]
 *       Hostnames on stdin, one per line.  Host i (of n) starts no earlier than
 *       S*i/n seconds after the start and only while fewer than C connections
 *       are open.  Latency runs from just before connect() to the end of the
 *       handshake; then the connection is closed.  Prints one JSON object:
 *       {"ok", "failed", "latencies", "launch_span", "seconds", "errors"}.
 *       "t0" is the start on CLOCK_MONOTONIC (seconds), as Python's time.monotonic().
 *   tlsload probe --port P --cafile F --host H --interval I [--connections K]
 *                 [--timeout T]
 *       Prints "ready" on stdout, then starts one fresh verified handshake with H
 *       every I seconds (open loop: a slow handshake does not delay the next start)
 *       with at most K in flight (default 1: then each waits for the one before),
 *       until stdin reaches EOF (the parent closes the pipe); then prints
 *       {"samples": [...], "starts": [...], "failures": n, "late": n, "cpu_s": s}
 *       on stdout and exits 0.  "starts" are the samples' start times on
 *       CLOCK_MONOTONIC; "late" counts starts delayed because K were in flight;
 *       "cpu_s" is the prober's own user + system CPU time.
 *
 * Connections go to 127.0.0.1 only.  Exit status 2 for bad arguments or input,
 * 1 for a setup failure (CA file, epoll), 0 otherwise.  A few failure details
 * (at most MAX_DETAILS lines) go to stderr.
 *
 * Build: cc -O2 -Wall -Wextra -o tlsload tlsload.c -lssl -lcrypto
 */

#define _GNU_SOURCE

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_HOST 253
#define MAX_CONCURRENCY 10000
#define MAX_PROBE_CONNECTIONS 256
#define MAX_HOSTS 10000000
#define MAX_DETAILS 5
#define DEFAULT_TIMEOUT 10.0

/* Error kinds: the Python generator's keys (exception class names). */
#define E_NOT_VERIFIED "not verified (default certificate)"
#define E_TIMEOUT "TimeoutError"
#define E_SSL "SSLError"
#define E_SSL_EOF "SSLEOFError"

static const char *prog = "tlsload";

static void usage(const char *why)
{
    if (why != NULL)
        fprintf(stderr, "%s: %s\n", prog, why);
    fprintf(stderr,
            "usage: %s storm --port P --cafile F --concurrency C --spread S [--timeout T]"
            "  (hostnames on stdin)\n"
            "       %s probe --port P --cafile F --host H --interval I [--connections K]"
            " [--timeout T]"
            "  (until stdin reaches EOF)\n",
            prog, prog);
    exit(2);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* --- arguments ------------------------------------------------------------------------ */

struct options {
    int storm;         /* 1: storm, 0: probe */
    long port;
    const char *cafile;
    long concurrency;  /* storm */
    double spread;     /* storm */
    const char *host;  /* probe */
    double interval;   /* probe */
    long connections;  /* probe: most handshakes in flight at once */
    double timeout;
};

/* A hostname we are willing to put in SNI: 1-253 chars of letters, digits, '.', '-', '_'. */
static int valid_host(const char *s, size_t len)
{
    if (len == 0 || len > MAX_HOST)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_'))
            return 0;
    }
    return 1;
}

static long parse_long(const char *flag, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "%s: %s wants an integer in [%ld, %ld], not '%s'\n", prog, flag, lo, hi, s);
        usage(NULL);
    }
    return v;
}

static double parse_seconds(const char *flag, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* "!(v >= lo)" also rejects NaN */
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo) || v > hi) {
        fprintf(stderr, "%s: %s wants seconds in [%g, %g], not '%s'\n", prog, flag, lo, hi, s);
        usage(NULL);
    }
    return v;
}

static struct options parse_args(int argc, char **argv)
{
    struct options o = {.port = -1, .concurrency = -1, .spread = -1, .interval = -1,
                        .connections = 1, .timeout = DEFAULT_TIMEOUT};
    if (argc < 2)
        usage("no mode given");
    if (strcmp(argv[1], "storm") == 0)
        o.storm = 1;
    else if (strcmp(argv[1], "probe") == 0)
        o.storm = 0;
    else
        usage("the mode is 'storm' or 'probe'");
    for (int i = 2; i < argc; i += 2) {
        const char *flag = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", prog, flag);
            usage(NULL);
        }
        const char *value = argv[i + 1];
        if (strcmp(flag, "--port") == 0)
            o.port = parse_long(flag, value, 1, 65535);
        else if (strcmp(flag, "--cafile") == 0)
            o.cafile = value;
        else if (strcmp(flag, "--timeout") == 0)
            o.timeout = parse_seconds(flag, value, 0.001, 3600);
        else if (o.storm && strcmp(flag, "--concurrency") == 0)
            o.concurrency = parse_long(flag, value, 1, MAX_CONCURRENCY);
        else if (o.storm && strcmp(flag, "--spread") == 0)
            o.spread = parse_seconds(flag, value, 0, 3600);
        else if (!o.storm && strcmp(flag, "--host") == 0)
            o.host = value;
        else if (!o.storm && strcmp(flag, "--interval") == 0)
            o.interval = parse_seconds(flag, value, 0, 3600);
        else if (!o.storm && strcmp(flag, "--connections") == 0)
            o.connections = parse_long(flag, value, 1, MAX_PROBE_CONNECTIONS);
        else {
            fprintf(stderr, "%s: unknown option '%s' for %s\n", prog, flag, argv[1]);
            usage(NULL);
        }
    }
    if (o.port < 0 || o.cafile == NULL)
        usage("--port and --cafile are required");
    if (o.storm && (o.concurrency < 0 || o.spread < 0))
        usage("storm needs --concurrency and --spread");
    if (!o.storm && (o.host == NULL || o.interval < 0))
        usage("probe needs --host and --interval");
    if (!o.storm && !valid_host(o.host, strlen(o.host)))
        usage("--host must be 1-253 characters of letters, digits, '.', '-' and '_'");
    return o;
}

/* Hostnames from stdin, one per line ("\r\n" accepted); exits 2 on a bad line. */
static char **read_hosts(size_t *count)
{
    size_t n = 0, cap = 1024;
    char **hosts = malloc(cap * sizeof *hosts);
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    if (hosts == NULL) {
        perror("malloc");
        exit(1);
    }
    while ((len = getline(&line, &line_cap, stdin)) != -1) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (!valid_host(line, (size_t)len) || strlen(line) != (size_t)len) {
            fprintf(stderr, "%s: stdin line %zu is not a hostname (1-253 characters of "
                            "letters, digits, '.', '-' and '_')\n", prog, n + 1);
            exit(2);
        }
        if (n == MAX_HOSTS)
            usage("too many hostnames on stdin");
        if (n == cap) {
            cap *= 2;
            char **bigger = realloc(hosts, cap * sizeof *hosts);
            if (bigger == NULL) {
                perror("realloc");
                exit(1);
            }
            hosts = bigger;
        }
        hosts[n] = strdup(line);
        if (hosts[n] == NULL) {
            perror("strdup");
            exit(1);
        }
        n++;
    }
    free(line);
    *count = n;
    return hosts;
}

/* --- one connection ---------------------------------------------------------------------- */

enum state { FREE, CONNECTING, HANDSHAKING };

struct conn {
    enum state state;
    int fd;
    SSL *ssl;
    const char *host;
    double start;     /* just before connect() */
    double deadline;  /* start + timeout */
};

struct loop {
    int epfd;
    SSL_CTX *ctx;
    struct sockaddr_in addr;
    double timeout;
    int details;      /* failure lines written to stderr so far */
};

/* Python's name for an errno from connect() or socket I/O. */
static const char *errno_kind(int err)
{
    switch (err) {
    case ECONNREFUSED:
        return "ConnectionRefusedError";
    case ECONNRESET:
        return "ConnectionResetError";
    case ECONNABORTED:
        return "ConnectionAbortedError";
    case EPIPE:
        return "BrokenPipeError";
    case ETIMEDOUT:
        return E_TIMEOUT;
    default:
        return "OSError";
    }
}

static void detail(struct loop *lp, const struct conn *c, const char *kind, const char *what)
{
    if (lp->details >= MAX_DETAILS)
        return;
    lp->details++;
    fprintf(stderr, "%s: %s: %s (%s)\n", prog, c->host, kind, what);
}

static void conn_close(struct loop *lp, struct conn *c)
{
    if (c->ssl != NULL) {
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    if (c->fd >= 0) {
        epoll_ctl(lp->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
    }
    c->state = FREE;
}

static int conn_watch(struct loop *lp, struct conn *c, int op, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};
    return epoll_ctl(lp->epfd, op, c->fd, &ev);
}

/*
 * Drive the handshake as far as it goes without blocking.  Returns NULL when it
 * is complete, "" when it waits for the socket (epoll interest updated), or the
 * error kind when it failed.
 */
static const char *conn_handshake(struct loop *lp, struct conn *c)
{
    /* OpenSSL's error queue is per thread, shared by all our connections. */
    ERR_clear_error();
    errno = 0;
    int rc = SSL_do_handshake(c->ssl);
    if (rc == 1)
        return NULL;
    int err = SSL_get_error(c->ssl, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        uint32_t want = err == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT;
        if (conn_watch(lp, c, EPOLL_CTL_MOD, want) == 0)
            return "";
        detail(lp, c, "OSError", strerror(errno));
        return "OSError";
    }
    const char *kind;
    char what[256];
    unsigned long e = ERR_peek_error();
    if (err == SSL_ERROR_SSL && SSL_get_verify_result(c->ssl) != X509_V_OK) {
        kind = E_NOT_VERIFIED;
        snprintf(what, sizeof what, "%s",
                 X509_verify_cert_error_string(SSL_get_verify_result(c->ssl)));
    } else if (err == SSL_ERROR_SSL && ERR_GET_LIB(e) == ERR_LIB_SSL &&
               ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        kind = E_SSL_EOF;
        snprintf(what, sizeof what, "the server closed the connection during the handshake");
    } else if (err == SSL_ERROR_SYSCALL && errno != 0) {
        kind = errno_kind(errno);
        snprintf(what, sizeof what, "%s", strerror(errno));
    } else if (err == SSL_ERROR_SYSCALL) {
        kind = E_SSL_EOF;
        snprintf(what, sizeof what, "EOF during the handshake");
    } else {
        kind = E_SSL;
        if (e != 0)
            ERR_error_string_n(e, what, sizeof what);
        else
            snprintf(what, sizeof what, "SSL_get_error %d", err);
    }
    ERR_clear_error();
    detail(lp, c, kind, what);
    return kind;
}

/* Socket, connect(), SSL object.  Same return convention as conn_handshake. */
static const char *conn_start(struct loop *lp, struct conn *c, const char *host)
{
    static const int one = 1;
    c->host = host;
    c->ssl = NULL;
    c->start = now();
    c->deadline = c->start + lp->timeout;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        detail(lp, c, "OSError", strerror(errno));
        return "OSError";
    }
    /* asyncio sets TCP_NODELAY on its TCP sockets too */
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->start = now();
    c->deadline = c->start + lp->timeout;
    if (connect(c->fd, (const struct sockaddr *)&lp->addr, sizeof lp->addr) != 0 &&
        errno != EINPROGRESS) {
        int e = errno;
        detail(lp, c, errno_kind(e), strerror(e));
        return errno_kind(e);
    }
    c->ssl = SSL_new(lp->ctx);
    if (c->ssl == NULL || SSL_set_fd(c->ssl, c->fd) != 1 ||
        SSL_set_tlsext_host_name(c->ssl, host) != 1 || SSL_set1_host(c->ssl, host) != 1) {
        ERR_clear_error();
        detail(lp, c, E_SSL, "could not set up the SSL object");
        return E_SSL;
    }
    SSL_set_connect_state(c->ssl);
    c->state = CONNECTING;
    if (conn_watch(lp, c, EPOLL_CTL_ADD, EPOLLOUT) != 0) {
        detail(lp, c, "OSError", strerror(errno));
        return "OSError";
    }
    return "";
}

/* The socket is ready: finish connecting, then go on with the handshake. */
static const char *conn_step(struct loop *lp, struct conn *c)
{
    if (c->state == CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err != 0) {
            detail(lp, c, errno_kind(err), strerror(err));
            return errno_kind(err);
        }
        c->state = HANDSHAKING;
    }
    return conn_handshake(lp, c);
}

/* After a completed handshake: one non-blocking close_notify, then close. */
static void conn_finish(struct loop *lp, struct conn *c)
{
    ERR_clear_error();
    SSL_shutdown(c->ssl);
    ERR_clear_error();
    conn_close(lp, c);
}

static void loop_init(struct loop *lp, const struct options *o)
{
    memset(lp, 0, sizeof *lp);
    lp->timeout = o->timeout;
    lp->addr.sin_family = AF_INET;
    lp->addr.sin_port = htons((uint16_t)o->port);
    lp->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lp->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (lp->epfd < 0) {
        perror("epoll_create1");
        exit(1);
    }
    lp->ctx = SSL_CTX_new(TLS_client_method());
    if (lp->ctx == NULL || SSL_CTX_set_min_proto_version(lp->ctx, TLS1_2_VERSION) != 1) {
        fprintf(stderr, "%s: cannot create the TLS client context\n", prog);
        exit(1);
    }
    if (SSL_CTX_load_verify_locations(lp->ctx, o->cafile, NULL) != 1) {
        fprintf(stderr, "%s: cannot load the CA file '%s'\n", prog, o->cafile);
        exit(1);
    }
    SSL_CTX_set_verify(lp->ctx, SSL_VERIFY_PEER, NULL);
    /* Every handshake is a full one: no client session cache, no session ever set. */
    SSL_CTX_set_session_cache_mode(lp->ctx, SSL_SESS_CACHE_OFF);
}

/* Milliseconds for epoll_wait until time t (rounded up, so we never wake early and spin). */
static int wait_ms(double t, double at)
{
    double ms = (t - at) * 1000.0;
    if (ms <= 0)
        return 0;
    if (ms > 60000)
        return 60000;
    return (int)ms + 1;
}

static void print_seconds(const double *values, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf("%s%.9f", i ? ", " : "", values[i]);
    putchar(']');
}

/* --- storm ------------------------------------------------------------------------------ */

struct kinds {
    const char *name[32];
    long count[32];
    int n;
};

static void count_kind(struct kinds *k, const char *name)
{
    for (int i = 0; i < k->n; i++) {
        if (strcmp(k->name[i], name) == 0) {
            k->count[i]++;
            return;
        }
    }
    if (k->n < 32) {  /* kinds are our own constant strings: a handful at most */
        k->name[k->n] = name;
        k->count[k->n++] = 1;
    }
}

static int storm(const struct options *o)
{
    size_t n;
    char **hosts = read_hosts(&n);
    struct loop lp;
    loop_init(&lp, o);

    size_t slots = (size_t)o->concurrency < n ? (size_t)o->concurrency : n;
    struct conn *conns = calloc(slots ? slots : 1, sizeof *conns);
    double *latencies = malloc((n ? n : 1) * sizeof *latencies);
    struct epoll_event *events = malloc((slots ? slots : 1) * sizeof *events);
    if (conns == NULL || latencies == NULL || events == NULL) {
        perror("malloc");
        return 1;
    }
    for (size_t i = 0; i < slots; i++) {
        conns[i].state = FREE;
        conns[i].fd = -1;
    }

    struct kinds kinds = {.n = 0};
    size_t next = 0, done = 0, ok = 0, active = 0;
    double first_launch = 0, last_launch = 0;
    double t0 = now();

    while (done < n) {
        double t = now();
        /* Launch every host whose time has come, while a slot is free (in order). */
        while (next < n && active < slots && t >= t0 + o->spread * (double)next / (double)n) {
            struct conn *c = conns;
            while (c->state != FREE)
                c++;
            const char *kind = conn_start(&lp, c, hosts[next]);
            if (next == 0)
                first_launch = c->start;
            last_launch = c->start;
            next++;
            if (kind[0] == '\0') {
                active++;
            } else {
                count_kind(&kinds, kind);
                conn_close(&lp, c);
                done++;
            }
            t = now();
        }
        if (done == n)
            break;

        /* Sleep until a socket is ready, the next launch is due, or a deadline passes. */
        double wake = t + 60;
        if (next < n && active < slots) {
            double due = t0 + o->spread * (double)next / (double)n;
            wake = due < wake ? due : wake;
        }
        for (size_t i = 0; i < slots; i++)
            if (conns[i].state != FREE && conns[i].deadline < wake)
                wake = conns[i].deadline;
        int ready = epoll_wait(lp.epfd, events, (int)slots, wait_ms(wake, t));
        if (ready < 0 && errno != EINTR) {
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < ready; i++) {
            struct conn *c = events[i].data.ptr;
            if (c->state == FREE)
                continue;
            const char *kind = conn_step(&lp, c);
            if (kind != NULL && kind[0] == '\0')
                continue;
            if (kind == NULL) {
                latencies[ok++] = now() - c->start;
                conn_finish(&lp, c);
            } else {
                count_kind(&kinds, kind);
                conn_close(&lp, c);
            }
            active--;
            done++;
        }

        t = now();
        for (size_t i = 0; i < slots; i++) {
            struct conn *c = &conns[i];
            if (c->state != FREE && t >= c->deadline) {
                detail(&lp, c, E_TIMEOUT, "no handshake within the timeout");
                count_kind(&kinds, E_TIMEOUT);
                conn_close(&lp, c);
                active--;
                done++;
            }
        }
    }
    double seconds = now() - t0;

    printf("{\"ok\": %zu, \"failed\": %zu, \"latencies\": ", ok, n - ok);
    print_seconds(latencies, ok);
    printf(", \"launch_span\": %.9f, \"seconds\": %.9f, \"errors\": {",
           last_launch - first_launch, seconds);
    for (int i = 0; i < kinds.n; i++)
        printf("%s\"%s\": %ld", i ? ", " : "", kinds.name[i], kinds.count[i]);
    printf("}, \"t0\": %.9f}\n", t0);

    for (size_t i = 0; i < n; i++)
        free(hosts[i]);
    free(hosts);
    free(conns);
    free(latencies);
    free(events);
    close(lp.epfd);
    SSL_CTX_free(lp.ctx);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* --- probe ------------------------------------------------------------------------------ */

struct samples {
    double *latency;
    double *start;
    size_t n, cap;
};

static void add_sample(struct samples *sm, double start, double latency)
{
    if (sm->n == sm->cap) {
        sm->cap = sm->cap ? sm->cap * 2 : 1024;
        sm->latency = realloc(sm->latency, sm->cap * sizeof *sm->latency);
        sm->start = realloc(sm->start, sm->cap * sizeof *sm->start);
        if (sm->latency == NULL || sm->start == NULL) {
            perror("realloc");
            exit(1);
        }
    }
    sm->latency[sm->n] = latency;
    sm->start[sm->n++] = start;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* One handshake is over (kind NULL: verified): note it and free its slot. */
static void probe_done(struct loop *lp, struct conn *c, const char *kind, struct samples *sm,
                       long *failures)
{
    if (kind == NULL) {
        add_sample(sm, c->start, now() - c->start);
        conn_finish(lp, c);
    } else {
        (*failures)++;
        conn_close(lp, c);
    }
}

static int probe(const struct options *o)
{
    struct loop lp;
    loop_init(&lp, o);
    /* stdin shares the epoll set: its event has data.ptr NULL */
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(lp.epfd, EPOLL_CTL_ADD, STDIN_FILENO, &ev) != 0) {
        fprintf(stderr, "%s: probe needs stdin to be a pipe (its EOF stops the probe): %s\n",
                prog, strerror(errno));
        return 2;
    }
    size_t slots = (size_t)o->connections;
    struct conn *conns = calloc(slots, sizeof *conns);
    struct epoll_event *events = malloc((slots + 1) * sizeof *events);
    if (conns == NULL || events == NULL) {
        perror("malloc");
        return 1;
    }
    for (size_t i = 0; i < slots; i++) {
        conns[i].state = FREE;
        conns[i].fd = -1;
    }
    struct samples sm = {0};
    long failures = 0, late = 0;
    size_t active = 0;
    int stopping = 0;
    printf("ready\n");
    fflush(stdout);

    double next_at = now();
    int was_late = 0;  /* the due start is waiting for a free slot (counted once) */
    while (!stopping) {
        double t = now();
        /* Every start whose time has come, while a slot is free. */
        while (t >= next_at && active < slots) {
            struct conn *c = conns;
            while (c->state != FREE)
                c++;
            const char *kind = conn_start(&lp, c, o->host);
            if (kind[0] == '\0')
                active++;
            else
                probe_done(&lp, c, kind, &sm, &failures);
            next_at += o->interval;
            was_late = 0;
            t = now();
        }
        if (t >= next_at && active == slots && !was_late) {
            late++;
            was_late = 1;
        }
        double wake = active < slots ? next_at : t + 60;
        for (size_t i = 0; i < slots; i++)
            if (conns[i].state != FREE && conns[i].deadline < wake)
                wake = conns[i].deadline;
        int ready = epoll_wait(lp.epfd, events, (int)slots + 1, wait_ms(wake, t));
        if (ready < 0 && errno != EINTR) {
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < ready; i++) {
            struct conn *c = events[i].data.ptr;
            if (c == NULL) {
                char buf[256];
                ssize_t got = read(STDIN_FILENO, buf, sizeof buf);
                if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN))
                    stopping = 1;
                continue;  /* anything written to stdin is ignored */
            }
            if (c->state == FREE)
                continue;
            const char *kind = conn_step(&lp, c);
            if (kind != NULL && kind[0] == '\0')
                continue;
            probe_done(&lp, c, kind, &sm, &failures);
            active--;
        }
        t = now();
        for (size_t i = 0; i < slots; i++) {
            struct conn *c = &conns[i];
            if (c->state != FREE && t >= c->deadline) {
                detail(&lp, c, E_TIMEOUT, "no handshake within the timeout");
                probe_done(&lp, c, E_TIMEOUT, &sm, &failures);
                active--;
            }
        }
    }
    /* Handshakes still in flight at EOF are dropped: neither samples nor failures. */
    for (size_t i = 0; i < slots; i++)
        if (conns[i].state != FREE)
            conn_close(&lp, &conns[i]);

    printf("{\"samples\": ");
    print_seconds(sm.latency, sm.n);
    printf(", \"starts\": ");
    print_seconds(sm.start, sm.n);
    printf(", \"failures\": %ld, \"late\": %ld, \"cpu_s\": %.6f}\n", failures, late,
           cpu_seconds());
    free(sm.latency);
    free(sm.start);
    free(conns);
    free(events);
    close(lp.epfd);
    SSL_CTX_free(lp.ctx);
    return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct options o = parse_args(argc, argv);
    /* A write to a connection the server has reset must fail with EPIPE, not kill us. */
    signal(SIGPIPE, SIG_IGN);
    return o.storm ? storm(&o) : probe(&o);
}
