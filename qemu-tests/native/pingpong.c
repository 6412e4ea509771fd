// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * vrdma-native-pingpong: the native peer of vrdma-pingpong.
 *
 * It speaks the vrdma-pingpong protocol (defined in guest-driver/tools/src/pingpong/mod.rs;
 * keep the two in step) over rdma-core's libibverbs directly on a device, so that a vrdma
 * process and a native process can exchange and verify RDMA traffic, and so that the protocol
 * itself can be checked natively on Soft-RoCE.
 *
 *   vrdma-native-pingpong server|client [-d DEV] [-p PORT] [-H HOST] [-o OPS] [-s SIZES]
 *                         [-n ITERS] [--bw] [-w WINDOW] [-l LEN] [-t SECS] [-j FILE]
 *   vrdma-native-pingpong selftest
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* Protocol constants: see guest-driver/tools/src/pingpong/{mod,plan,exchange}.rs. */
#define MAGIC "VRDMA-PP/1"
#define MAX_LINE 1024
#define DEFAULT_PORT 18600
#define MAX_SIZE (1u << 20)
#define MTU_BYTES 1024u
#define GRH_LEN 40u
#define MAX_WINDOW 128u
#define MAX_ITERS 10000000u
#define MAX_SIZES 32
#define UD_QKEY 0x11111111u
#define MAX_INLINE 256u
#define PORT_NUM 1
#define GID_INDEX 0

/* Queue depths: a full bandwidth window plus the control messages around it. */
#define RC_SEND_DEPTH (MAX_WINDOW + 8)
#define RC_RECV_DEPTH (MAX_WINDOW + 8)
#define UD_DEPTH 16
#define CQ_DEPTH 512

enum op { OP_SEND = 1, OP_SEND_IMM, OP_WRITE, OP_WRITE_IMM, OP_READ, OP_UD_SEND, OP_COUNT };
static const char *const op_names[OP_COUNT] = {
	NULL, "send", "send_imm", "write", "write_imm", "read", "ud_send",
};
enum direction { CLIENT_TO_SERVER = 0, SERVER_TO_CLIENT = 1 };

/* wr_id of receives: which queue pair they belong to. */
enum { WRID_RC_RECV = 1, WRID_UD_RECV = 2, WRID_SEND = 3 };

struct plan {
	enum op ops[OP_COUNT];
	int nops;
	uint32_t sizes[MAX_SIZES];
	int nsizes;
	uint32_t iters;
	uint32_t window; /* bandwidth mode if not 0 */
	bool oneway;
};

struct hello {
	uint32_t qpn, psn;
	uint8_t gid[16];
	uint32_t rkey;
	uint64_t addr, len;
	struct plan plan;
	bool has_ud;
	uint32_t ud_qpn;
};

struct row {
	enum op op;
	uint32_t size, iters;
	bool inl, has_latency;
	double min_us, max_us, typical_us, avg_us, p99_us, mib_s, mmsg_s;
};

struct peer {
	bool is_server;
	int sock;
	double timeout_s;
	struct ibv_context *dev;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint8_t *buf; /* 2 x len: area, then source */
	uint64_t len;
	struct ibv_cq *send_cq, *recv_cq;
	struct ibv_qp *qp, *ud_qp;
	struct ibv_ah *ah;
	uint32_t max_inline, ud_max_inline;
	struct hello local, remote;
	unsigned sends_outstanding;
	/* RC path attributes (--mtu, --qp-timeout, --retry-cnt, --rnr-retry, --min-rnr-timer). */
	enum ibv_mtu path_mtu;
	uint8_t qp_timeout, retry_cnt, rnr_retry, min_rnr_timer;
	/* --receives-after: the RC receives wait for that file (after ready). */
	bool hold_receives;
	/* --events: wait for completions by sleeping on completion events. */
	bool use_events;
	/* --events: both CQs report to this channel; a CQ is armed until its event is taken. */
	struct ibv_comp_channel *channel;
	bool send_cq_armed, recv_cq_armed;
	/* What runs now, for error messages. */
	enum op cur_op;
	uint32_t cur_size, cur_iter;
	bool in_step;
};

static struct peer *current_peer;

static void send_line(int sock, const char *line);

static void __attribute__((noreturn, format(printf, 1, 2))) fail(const char *fmt, ...)
{
	char what[600], msg[800];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (current_peer && current_peer->in_step)
		snprintf(msg, sizeof(msg), "%s size %u iteration %u: %s",
			 op_names[current_peer->cur_op], current_peer->cur_size,
			 current_peer->cur_iter, what);
	else
		snprintf(msg, sizeof(msg), "%s", what);
	fprintf(stderr, "vrdma-native-pingpong: error: %s\n", msg);
	if (current_peer && current_peer->sock >= 0) {
		char line[MAX_LINE];
		size_t n = (size_t)snprintf(line, sizeof(line) - 1, MAGIC " error %s", msg);

		if (n > sizeof(line) - 2)
			n = sizeof(line) - 2;
		for (size_t i = sizeof(MAGIC); i < n; i++)
			if (line[i] < 0x20 || line[i] > 0x7e)
				line[i] = '?';
		line[n] = '\n';
		line[n + 1] = '\0';
		send_line(current_peer->sock, line);
	}
	exit(1);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- Data patterns (guest-driver/tools/src/pingpong/pattern.rs) ---- */

static uint64_t splitmix64(uint64_t x)
{
	uint64_t z = x + 0x9E3779B97F4A7C15ull;

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static uint64_t pattern_seed(enum op op, uint32_t size, uint32_t iter, enum direction dir)
{
	return ((uint64_t)op << 56) ^ ((uint64_t)dir << 48) ^
	       ((uint64_t)size * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)iter * 0xD1B54A32D192ED03ull);
}

static void pattern_fill(uint8_t *buf, enum op op, uint32_t size, uint32_t iter,
			 enum direction dir)
{
	uint64_t seed = pattern_seed(op, size, iter, dir);

	for (uint64_t j = 0; j * 8 < size; j++) {
		uint64_t word = splitmix64(seed ^ j);

		for (unsigned i = 0; i < 8 && j * 8 + i < size; i++)
			buf[j * 8 + i] = (uint8_t)(word >> (8 * i));
	}
}

/* Returns the first differing offset, or -1 if `buf` holds the pattern. */
static long pattern_check(const uint8_t *buf, enum op op, uint32_t size, uint32_t iter,
			  enum direction dir, uint8_t *expected)
{
	uint64_t seed = pattern_seed(op, size, iter, dir);

	for (uint64_t j = 0; j * 8 < size; j++) {
		uint64_t word = splitmix64(seed ^ j);

		for (unsigned i = 0; i < 8 && j * 8 + i < size; i++) {
			uint8_t e = (uint8_t)(word >> (8 * i));

			if (buf[j * 8 + i] != e) {
				*expected = e;
				return (long)(j * 8 + i);
			}
		}
	}
	return -1;
}

static void verify(const uint8_t *buf, enum op op, uint32_t size, uint32_t iter,
		   enum direction dir)
{
	uint8_t expected = 0;
	long off = pattern_check(buf, op, size, iter, dir, &expected);

	if (off >= 0)
		fail("data mismatch: first differing offset %ld (expected 0x%02x, found 0x%02x)",
		     off, expected, buf[off]);
}

/* ---- Plans ---- */

static bool parse_decimal(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;

	if (n == 0 || n > 10)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = v;
	return true;
}

/* Splits `s` (n bytes) at commas and calls `item` for each piece; false on an empty piece. */
static bool parse_ops(const char *s, size_t n, struct plan *p, char *err, size_t errlen)
{
	size_t start = 0;

	p->nops = 0;
	if (n == 0) {
		snprintf(err, errlen, "no operation given");
		return false;
	}
	for (size_t i = 0; i <= n; i++) {
		if (i < n && s[i] != ',')
			continue;
		enum op found = 0;

		for (int o = 1; o < OP_COUNT; o++)
			if (strlen(op_names[o]) == i - start &&
			    !memcmp(op_names[o], s + start, i - start))
				found = (enum op)o;
		if (!found) {
			snprintf(err, errlen, "unknown operation \"%.*s\"", (int)(i - start),
				 s + start);
			return false;
		}
		for (int k = 0; k < p->nops; k++)
			if (p->ops[k] == found) {
				snprintf(err, errlen, "operation %s listed twice", op_names[found]);
				return false;
			}
		p->ops[p->nops++] = found;
		start = i + 1;
	}
	return true;
}

static bool parse_sizes(const char *s, size_t n, struct plan *p, char *err, size_t errlen)
{
	size_t start = 0;

	p->nsizes = 0;
	if (n == 0) {
		snprintf(err, errlen, "no size given");
		return false;
	}
	for (size_t i = 0; i <= n; i++) {
		uint64_t v;

		if (i < n && s[i] != ',')
			continue;
		if (!parse_decimal(s + start, i - start, &v) || v == 0 || v > MAX_SIZE) {
			snprintf(err, errlen, "size \"%.*s\" is not a number in 1..=%u",
				 (int)(i - start), s + start, MAX_SIZE);
			return false;
		}
		if (p->nsizes == MAX_SIZES) {
			snprintf(err, errlen, "more than %d sizes", MAX_SIZES);
			return false;
		}
		for (int k = 0; k < p->nsizes; k++)
			if (p->sizes[k] == v) {
				snprintf(err, errlen, "size %" PRIu64 " listed twice", v);
				return false;
			}
		p->sizes[p->nsizes++] = (uint32_t)v;
		start = i + 1;
	}
	return true;
}

static bool step_runs(enum op op, uint32_t size)
{
	return op != OP_UD_SEND || size <= MTU_BYTES;
}

static uint64_t area_bytes(enum op op, uint32_t size)
{
	return op == OP_UD_SEND ? (uint64_t)size + GRH_LEN : size;
}

static uint64_t plan_area_len(const struct plan *p)
{
	uint64_t len = 0;

	for (int o = 0; o < p->nops; o++)
		for (int s = 0; s < p->nsizes; s++)
			if (step_runs(p->ops[o], p->sizes[s]) &&
			    area_bytes(p->ops[o], p->sizes[s]) > len)
				len = area_bytes(p->ops[o], p->sizes[s]);
	return len;
}

static bool plan_uses(const struct plan *p, enum op op)
{
	for (int o = 0; o < p->nops; o++)
		if (p->ops[o] == op)
			return true;
	return false;
}

/* The checks of Plan::new beyond what parsing ensures. */
static bool plan_check(const struct plan *p, char *err, size_t errlen)
{
	if (p->iters == 0 || p->iters > MAX_ITERS) {
		snprintf(err, errlen, "iteration count %u is not in 1..=%u", p->iters, MAX_ITERS);
		return false;
	}
	if (p->window > MAX_WINDOW) {
		snprintf(err, errlen, "window %u is not in 1..=%u", p->window, MAX_WINDOW);
		return false;
	}
	for (int o = 0; o < p->nops && p->oneway; o++)
		if (p->ops[o] == OP_READ) {
			snprintf(err, errlen, "one-way mode cannot run read");
			return false;
		}
	for (int o = 0; o < p->nops && p->window; o++)
		if (p->ops[o] != OP_SEND && p->ops[o] != OP_WRITE) {
			snprintf(err, errlen, "bandwidth mode streams only send and write, not %s",
				 op_names[p->ops[o]]);
			return false;
		}
	if (plan_area_len(p) == 0) {
		snprintf(err, errlen, "no step left: ud_send runs only sizes up to %u", MTU_BYTES);
		return false;
	}
	return true;
}

static bool plan_from_wire(const char *s, size_t n, struct plan *p, char *err, size_t errlen)
{
	const char *c1 = memchr(s, ':', n);
	const char *c2 = c1 ? memchr(c1 + 1, ':', n - (size_t)(c1 + 1 - s)) : NULL;
	const char *c3 = c2 ? memchr(c2 + 1, ':', n - (size_t)(c2 + 1 - s)) : NULL;
	const char *end = s + n;
	uint64_t v;

	memset(p, 0, sizeof(*p));
	if (!c3 || memchr(c3 + 1, ':', (size_t)(end - c3 - 1))) {
		snprintf(err, errlen, "plan \"%.*s\" is not <ops>:<sizes>:<iters>:<mode>", (int)n, s);
		return false;
	}
	if (!parse_ops(s, (size_t)(c1 - s), p, err, errlen) ||
	    !parse_sizes(c1 + 1, (size_t)(c2 - c1 - 1), p, err, errlen))
		return false;
	if (!parse_decimal(c2 + 1, (size_t)(c3 - c2 - 1), &v) || v == 0 || v > MAX_ITERS) {
		snprintf(err, errlen, "bad iteration count \"%.*s\"", (int)(c3 - c2 - 1), c2 + 1);
		return false;
	}
	p->iters = (uint32_t)v;
	size_t mlen = (size_t)(end - c3 - 1);

	if (mlen == 6 && !memcmp(c3 + 1, "verify", 6)) {
		p->window = 0;
	} else if (mlen == 6 && !memcmp(c3 + 1, "oneway", 6)) {
		p->oneway = true;
	} else if (mlen > 2 && !memcmp(c3 + 1, "bw", 2) && parse_decimal(c3 + 3, mlen - 2, &v) &&
		   v >= 1 && v <= MAX_WINDOW) {
		p->window = (uint32_t)v;
	} else {
		snprintf(err, errlen, "bad mode \"%.*s\"", (int)mlen, c3 + 1);
		return false;
	}
	return plan_check(p, err, errlen);
}

static int plan_to_wire(const struct plan *p, char *out, size_t outlen)
{
	size_t n = 0;

	for (int o = 0; o < p->nops; o++)
		n += (size_t)snprintf(out + n, outlen - n, "%s%s", o ? "," : "", op_names[p->ops[o]]);
	n += (size_t)snprintf(out + n, outlen - n, ":");
	for (int s = 0; s < p->nsizes; s++)
		n += (size_t)snprintf(out + n, outlen - n, "%s%u", s ? "," : "", p->sizes[s]);
	if (p->window)
		n += (size_t)snprintf(out + n, outlen - n, ":%u:bw%u", p->iters, p->window);
	else if (p->oneway)
		n += (size_t)snprintf(out + n, outlen - n, ":%u:oneway", p->iters);
	else
		n += (size_t)snprintf(out + n, outlen - n, ":%u:verify", p->iters);
	return (int)n;
}

static bool plan_equal(const struct plan *a, const struct plan *b)
{
	char wa[MAX_LINE], wb[MAX_LINE];

	plan_to_wire(a, wa, sizeof(wa));
	plan_to_wire(b, wb, sizeof(wb));
	return !strcmp(wa, wb);
}

/* ---- Out-of-band lines (guest-driver/tools/src/pingpong/exchange.rs) ---- */

static void send_line(int sock, const char *line)
{
	size_t len = strlen(line), off = 0;

	while (off < len) {
		ssize_t n = send(sock, line + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return; /* the peer is gone; the caller's next receive says so */
		off += (size_t)n;
	}
}

/* Reads one line (without its newline) into `line`; fails on timeout, EOF or an error line. */
static void receive_line(struct peer *pp, char *line)
{
	size_t n = 0;

	for (;;) {
		ssize_t r = recv(pp->sock, line + n, 1, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			fail("no line from the peer within %.0f s", pp->timeout_s);
		if (r < 0)
			fail("receiving from the peer: %s", strerror(errno));
		if (r == 0)
			fail("peer closed the connection");
		if (line[n] == '\n')
			break;
		if (line[n] != ' ' && (line[n] < 0x21 || line[n] > 0x7e))
			fail("peer sent a line that is not printable ASCII");
		if (++n >= MAX_LINE - 1)
			fail("peer sent a line longer than %d bytes", MAX_LINE);
	}
	line[n] = '\0';
	if (!strncmp(line, MAGIC " error ", sizeof(MAGIC " error ") - 1)) {
		pp->sock = -1; /* do not answer an error with an error */
		fail("peer failed: %s", line + sizeof(MAGIC " error ") - 1);
	}
}

static void expect_line(struct peer *pp, const char *word)
{
	char line[MAX_LINE], want[64];

	snprintf(want, sizeof(want), MAGIC " %s", word);
	receive_line(pp, line);
	if (strcmp(line, want))
		fail("expected \"%s\" from the peer, got \"%s\"", want, line);
}

/* Watches the connection while waiting for completions: a peer that failed or died ends the
 * wait. A regular line (the peer finishing first) stays in the socket for receive_line. */
static void check_peer(struct peer *pp)
{
	char peek[sizeof(MAGIC " error ")];
	ssize_t n = recv(pp->sock, peek, sizeof(peek) - 1, MSG_PEEK | MSG_DONTWAIT);

	if (n == 0)
		fail("peer closed the connection");
	if (n > 0 && (size_t)n == sizeof(peek) - 1 && !memcmp(peek, MAGIC " error ", (size_t)n)) {
		char line[MAX_LINE];

		receive_line(pp, line); /* fails with the peer's message */
	}
}

static void format_hello(const struct hello *h, char *line, size_t len)
{
	char plan[MAX_LINE];
	int n;

	plan_to_wire(&h->plan, plan, sizeof(plan));
	n = snprintf(line, len, MAGIC " qpn=%x psn=%x gid=", h->qpn, h->psn);
	for (int i = 0; i < 16; i++)
		n += snprintf(line + n, len - (size_t)n, "%02x", h->gid[i]);
	n += snprintf(line + n, len - (size_t)n, " rkey=%x addr=%" PRIx64 " len=%" PRIu64 " plan=%s",
		      h->rkey, h->addr, h->len, plan);
	if (h->has_ud)
		n += snprintf(line + n, len - (size_t)n, " udqpn=%x", h->ud_qpn);
	snprintf(line + n, len - (size_t)n, "\n");
}

static bool parse_hex(const char *s, size_t n, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;

	if (n == 0 || n > 16)
		return false;
	for (size_t i = 0; i < n; i++) {
		int d;

		if (s[i] >= '0' && s[i] <= '9')
			d = s[i] - '0';
		else if (s[i] >= 'a' && s[i] <= 'f')
			d = s[i] - 'a' + 10;
		else if (s[i] >= 'A' && s[i] <= 'F')
			d = s[i] - 'A' + 10;
		else
			return false;
		v = v << 4 | (uint64_t)d;
	}
	if (v > max)
		return false;
	*out = v;
	return true;
}

/* Takes the next space-separated field `name=value` from *cursor. */
static bool next_field(const char **cursor, const char *name, const char **value, size_t *vlen)
{
	const char *s = *cursor, *end = strchr(s, ' ');
	size_t nlen = strlen(name);

	if (!end)
		end = s + strlen(s);
	if ((size_t)(end - s) <= nlen || memcmp(s, name, nlen) || s[nlen] != '=')
		return false;
	*value = s + nlen + 1;
	*vlen = (size_t)(end - *value);
	*cursor = *end ? end + 1 : end;
	return true;
}

static bool parse_hello(const char *line, struct hello *h, char *err, size_t errlen)
{
	const char *cur = line, *v;
	size_t n;
	uint64_t x;

	memset(h, 0, sizeof(*h));
	if (strncmp(cur, MAGIC " ", sizeof(MAGIC))) {
		snprintf(err, errlen, "not a " MAGIC " line: \"%s\"", line);
		return false;
	}
	cur += sizeof(MAGIC);
#define FIELD(name, max, dst)                                                                      \
	do {                                                                                       \
		if (!next_field(&cur, name, &v, &n) || !parse_hex(v, n, max, &x)) {                 \
			snprintf(err, errlen, "bad or missing field " name " in \"%s\"", line);    \
			return false;                                                              \
		}                                                                                  \
		dst = x;                                                                           \
	} while (0)
	FIELD("qpn", 0xffffff, h->qpn);
	FIELD("psn", 0xffffff, h->psn);
	if (!next_field(&cur, "gid", &v, &n) || n != 32) {
		snprintf(err, errlen, "bad or missing field gid in \"%s\"", line);
		return false;
	}
	for (int i = 0; i < 16; i++) {
		if (!parse_hex(v + 2 * i, 2, 0xff, &x)) {
			snprintf(err, errlen, "bad gid in \"%s\"", line);
			return false;
		}
		h->gid[i] = (uint8_t)x;
	}
	FIELD("rkey", 0xffffffffull, h->rkey);
	FIELD("addr", UINT64_MAX, h->addr);
	if (!next_field(&cur, "len", &v, &n) || !parse_decimal(v, n, &h->len) || h->len == 0 ||
	    h->addr + h->len < h->addr) {
		snprintf(err, errlen, "bad or missing field len in \"%s\"", line);
		return false;
	}
	if (!next_field(&cur, "plan", &v, &n) || !plan_from_wire(v, n, &h->plan, err, errlen))
		return false;
	if (*cur) {
		FIELD("udqpn", 0xffffff, h->ud_qpn);
		h->has_ud = true;
	}
#undef FIELD
	if (*cur) {
		snprintf(err, errlen, "unexpected trailing text \"%s\"", cur);
		return false;
	}
	if (h->has_ud != plan_uses(&h->plan, OP_UD_SEND)) {
		snprintf(err, errlen, "udqpn must be present exactly when the plan has ud_send");
		return false;
	}
	return true;
}

/* ---- TCP ---- */

static void set_timeouts(int sock, double timeout_s)
{
	struct timeval tv = { .tv_sec = (time_t)timeout_s, .tv_usec = 0 };
	int one = 1;

	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int tcp_accept(const char *host, const char *port, double timeout_s)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE };
	struct addrinfo *res;
	int one = 1, lsock, sock;
	struct timeval tv = { .tv_sec = (time_t)timeout_s };

	if (getaddrinfo(host, port, &hints, &res))
		fail("cannot resolve %s", host);
	lsock = socket(res->ai_family, SOCK_STREAM, 0);
	if (lsock < 0)
		fail("socket: %s", strerror(errno));
	setsockopt(lsock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lsock, res->ai_addr, res->ai_addrlen) || listen(lsock, 1))
		fail("listening on %s:%s: %s", host, port, strerror(errno));
	freeaddrinfo(res);
	/* accept() honours SO_RCVTIMEO on Linux. */
	setsockopt(lsock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	sock = accept(lsock, NULL, NULL);
	if (sock < 0)
		fail("no client on %s:%s within %.0f s (%s)", host, port, timeout_s,
		     strerror(errno));
	close(lsock);
	set_timeouts(sock, timeout_s);
	return sock;
}

static int tcp_connect(const char *host, const char *port, double timeout_s)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	double deadline = now_s() + timeout_s;

	for (;;) {
		struct addrinfo *res, *ai;
		int err = getaddrinfo(host, port, &hints, &res);

		if (err)
			fail("cannot resolve %s: %s", host, gai_strerror(err));
		for (ai = res; ai; ai = ai->ai_next) {
			int sock = socket(ai->ai_family, SOCK_STREAM, 0);

			if (sock >= 0 && !connect(sock, ai->ai_addr, ai->ai_addrlen)) {
				freeaddrinfo(res);
				set_timeouts(sock, timeout_s);
				return sock;
			}
			err = errno;
			if (sock >= 0)
				close(sock);
		}
		freeaddrinfo(res);
		if (now_s() > deadline)
			fail("connecting to %s:%s: %s", host, port, strerror(err));
		usleep(50000);
	}
}

/* ---- RDMA resources ---- */

static struct ibv_context *open_device(const char *name)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_context *ctx = NULL;

	if (!list)
		fail("no RDMA devices: %s", strerror(errno));
	for (int i = 0; i < num; i++)
		if (!name || !strcmp(ibv_get_device_name(list[i]), name)) {
			ctx = ibv_open_device(list[i]);
			if (!ctx)
				fail("opening %s: %s", ibv_get_device_name(list[i]),
				     strerror(errno));
			break;
		}
	ibv_free_device_list(list);
	if (!ctx)
		fail("RDMA device %s not found", name ? name : "(any)");
	return ctx;
}

static uint32_t random_psn(void)
{
	uint32_t v;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		fail("getrandom: %s", strerror(errno));
	return v & 0xffffff;
}

static struct ibv_qp *create_qp(struct peer *pp, enum ibv_qp_type type, uint32_t send_depth,
				uint32_t recv_depth, uint32_t *max_inline)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = pp->send_cq,
		.recv_cq = pp->recv_cq,
		.cap = { .max_send_wr = send_depth, .max_recv_wr = recv_depth,
			 .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = MAX_INLINE },
		.qp_type = type,
	};
	struct ibv_qp *qp = ibv_create_qp(pp->pd, &attr);

	if (!qp)
		fail("creating a %s QP: %s", type == IBV_QPT_RC ? "RC" : "UD", strerror(errno));
	*max_inline = attr.cap.max_inline_data;
	return qp;
}

static void post_recv(struct peer *pp, struct ibv_qp *qp, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)pp->buf, .length = (uint32_t)pp->len,
			       .lkey = pp->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	int err = ibv_post_recv(qp, &wr, &bad);

	if (err)
		fail("posting a receive: %s", strerror(err));
}

static void setup(struct peer *pp, const struct plan *plan, uint64_t len, const char *devname)
{
	union ibv_gid gid;
	struct ibv_port_attr port;

	pp->dev = open_device(devname);
	if (ibv_query_port(pp->dev, PORT_NUM, &port))
		fail("querying port %d: %s", PORT_NUM, strerror(errno));
	if (port.state != IBV_PORT_ACTIVE)
		fail("port %d is not active", PORT_NUM);
	if (port.active_mtu < IBV_MTU_1024)
		fail("port %d MTU is below 1024", PORT_NUM);
	if (ibv_query_gid(pp->dev, PORT_NUM, GID_INDEX, &gid))
		fail("querying GID %d: %s", GID_INDEX, strerror(errno));
	pp->pd = ibv_alloc_pd(pp->dev);
	if (!pp->pd)
		fail("allocating a PD: %s", strerror(errno));
	pp->len = len;
	pp->buf = aligned_alloc(4096, (size_t)((2 * len + 4095) & ~4095ull));
	if (!pp->buf)
		fail("allocating %" PRIu64 " bytes", 2 * len);
	memset(pp->buf, 0, (size_t)(2 * len));
	pp->mr = ibv_reg_mr(pp->pd, pp->buf, (size_t)(2 * len),
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				    IBV_ACCESS_REMOTE_READ);
	if (!pp->mr)
		fail("registering %" PRIu64 " bytes: %s", 2 * len, strerror(errno));
	if (pp->use_events) {
		pp->channel = ibv_create_comp_channel(pp->dev);
		if (!pp->channel)
			fail("creating a completion channel: %s", strerror(errno));
	}
	pp->send_cq = ibv_create_cq(pp->dev, CQ_DEPTH, NULL, pp->channel, 0);
	pp->recv_cq = ibv_create_cq(pp->dev, CQ_DEPTH, NULL, pp->channel, 0);
	if (!pp->send_cq || !pp->recv_cq)
		fail("creating CQs: %s", strerror(errno));
	pp->qp = create_qp(pp, IBV_QPT_RC, RC_SEND_DEPTH, RC_RECV_DEPTH, &pp->max_inline);
	if (plan_uses(plan, OP_UD_SEND))
		pp->ud_qp = create_qp(pp, IBV_QPT_UD, UD_DEPTH, UD_DEPTH, &pp->ud_max_inline);

	pp->local = (struct hello){
		.qpn = pp->qp->qp_num,
		.psn = random_psn(),
		.rkey = pp->mr->rkey,
		.addr = (uintptr_t)pp->buf,
		.len = len,
		.plan = *plan,
		.has_ud = pp->ud_qp != NULL,
		.ud_qpn = pp->ud_qp ? pp->ud_qp->qp_num : 0,
	};
	memcpy(pp->local.gid, gid.raw, 16);
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, const char *state)
{
	int err = ibv_modify_qp(qp, attr, mask);

	if (err)
		fail("moving QP %u to %s: %s", qp->qp_num, state, strerror(err));
}

static void post_rc_receives(struct peer *pp)
{
	for (int i = 0; i < (int)RC_RECV_DEPTH; i++)
		post_recv(pp, pp->qp, WRID_RC_RECV);
}

static void connect_qps(struct peer *pp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = PORT_NUM;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_READ;
	modify(pp->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
	       "INIT");
	if (!pp->hold_receives)
		post_rc_receives(pp);

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = pp->path_mtu;
	a.dest_qp_num = pp->remote.qpn;
	a.rq_psn = pp->remote.psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = pp->min_rnr_timer;
	a.ah_attr.is_global = 1;
	memcpy(a.ah_attr.grh.dgid.raw, pp->remote.gid, 16);
	a.ah_attr.grh.sgid_index = GID_INDEX;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = PORT_NUM;
	modify(pp->qp, &a,
	       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	       "RTR");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = pp->qp_timeout;
	a.retry_cnt = pp->retry_cnt;
	a.rnr_retry = pp->rnr_retry;
	a.sq_psn = pp->local.psn;
	a.max_rd_atomic = 1;
	modify(pp->qp, &a,
	       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		       IBV_QP_MAX_QP_RD_ATOMIC,
	       "RTS");

	if (!pp->ud_qp)
		return;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = PORT_NUM;
	a.qkey = UD_QKEY;
	modify(pp->ud_qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
	       "INIT");
	for (int i = 0; i < UD_DEPTH; i++)
		post_recv(pp, pp->ud_qp, WRID_UD_RECV);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	modify(pp->ud_qp, &a, IBV_QP_STATE, "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = pp->local.psn;
	modify(pp->ud_qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");

	struct ibv_ah_attr ah = {
		.is_global = 1,
		.grh = { .sgid_index = GID_INDEX, .hop_limit = 1 },
		.port_num = PORT_NUM,
	};
	memcpy(ah.grh.dgid.raw, pp->remote.gid, 16);
	pp->ah = ibv_create_ah(pp->pd, &ah);
	if (!pp->ah)
		fail("creating an address handle: %s", strerror(errno));
}

static void teardown(struct peer *pp)
{
	if (pp->ah)
		ibv_destroy_ah(pp->ah);
	if (pp->ud_qp)
		ibv_destroy_qp(pp->ud_qp);
	ibv_destroy_qp(pp->qp);
	ibv_destroy_cq(pp->send_cq);
	ibv_destroy_cq(pp->recv_cq);
	if (pp->channel)
		ibv_destroy_comp_channel(pp->channel);
	ibv_dereg_mr(pp->mr);
	ibv_dealloc_pd(pp->pd);
	ibv_close_device(pp->dev);
	free(pp->buf);
}

/* ---- Work requests and completions ---- */

/* Posts one signaled send-queue work request. Payloads come from the source half, except that
 * an RDMA READ lands in the area. */
static void post(struct peer *pp, enum ibv_wr_opcode opcode, uint32_t size, uint32_t imm,
		 bool ud)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)pp->buf + (opcode == IBV_WR_RDMA_READ ? 0 : pp->len),
		.length = size,
		.lkey = pp->mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = WRID_SEND,
		.sg_list = size ? &sge : NULL,
		.num_sge = size ? 1 : 0,
		.opcode = opcode,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(imm),
	}, *bad;
	uint32_t max_inline = ud ? pp->ud_max_inline : pp->max_inline;
	int err;

	if (size && size <= max_inline && opcode != IBV_WR_RDMA_READ)
		wr.send_flags |= IBV_SEND_INLINE;
	if (opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	    opcode == IBV_WR_RDMA_READ) {
		wr.wr.rdma.remote_addr = pp->remote.addr;
		wr.wr.rdma.rkey = pp->remote.rkey;
	}
	if (ud) {
		wr.wr.ud.ah = pp->ah;
		wr.wr.ud.remote_qpn = pp->remote.ud_qpn;
		wr.wr.ud.remote_qkey = UD_QKEY;
	}
	err = ibv_post_send(ud ? pp->ud_qp : pp->qp, &wr, &bad);
	if (err)
		fail("posting work request opcode %d: %s", opcode, strerror(err));
	pp->sends_outstanding++;
}

/* After an empty poll of `cq`: returns whether it is time to look at the clock and the peer.
 * Busy polling says so every 1024 empty polls. With --events, an unarmed CQ is armed and the
 * caller polls once more (a completion added before the arm raises no event); an armed one
 * sleeps on the channel for at most 100 ms, so a failed peer is still noticed. */
static bool wait_completion(struct peer *pp, struct ibv_cq *cq, unsigned spins)
{
	if (!pp->channel)
		return (spins & 1023) == 1023;
	bool *armed = cq == pp->send_cq ? &pp->send_cq_armed : &pp->recv_cq_armed;

	if (!*armed) {
		if (ibv_req_notify_cq(cq, 0))
			fail("arming a CQ: %s", strerror(errno));
		*armed = true;
		return false;
	}
	struct pollfd ready = { .fd = pp->channel->fd, .events = POLLIN };

	if (poll(&ready, 1, 100) < 0 && errno != EINTR)
		fail("waiting for a completion event: %s", strerror(errno));
	if (ready.revents & POLLIN) {
		struct ibv_cq *event_cq;
		void *cq_context;

		if (ibv_get_cq_event(pp->channel, &event_cq, &cq_context))
			fail("reading a completion event: %s", strerror(errno));
		ibv_ack_cq_events(event_cq, 1);
		if (event_cq == pp->send_cq)
			pp->send_cq_armed = false;
		else
			pp->recv_cq_armed = false;
	}
	return true;
}

/* Polls `cq` for one completion within the timeout, watching the peer meanwhile. */
static void poll_one(struct peer *pp, struct ibv_cq *cq, struct ibv_wc *wc, const char *what)
{
	double deadline = now_s() + pp->timeout_s;

	for (unsigned spins = 0;; spins++) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0)
			fail("polling the %s CQ failed", what);
		if (n == 1)
			break;
		if (wait_completion(pp, cq, spins)) {
			if (now_s() > deadline)
				fail("no %s completion within %.0f s", what, pp->timeout_s);
			check_peer(pp);
		}
	}
	if (wc->status == IBV_WC_WR_FLUSH_ERR && cq == pp->recv_cq) {
		/* A flushed receive only says that the QP is in error; the send that failed (if
		 * it completed already) says why, e.g. an exhausted RNR retry count. */
		struct ibv_wc sent;

		while (ibv_poll_cq(pp->send_cq, 1, &sent) == 1)
			if (sent.status != IBV_WC_SUCCESS && sent.status != IBV_WC_WR_FLUSH_ERR)
				fail("send completion with status %s (vendor error 0x%x)",
				     ibv_wc_status_str(sent.status), sent.vendor_err);
	}
	if (wc->status != IBV_WC_SUCCESS)
		fail("%s completion with status %s (vendor error 0x%x)", what,
		     ibv_wc_status_str(wc->status), wc->vendor_err);
}

/* Waits for `count` send completions. */
static void reap_sends(struct peer *pp, unsigned count)
{
	struct ibv_wc wc;

	for (unsigned i = 0; i < count; i++) {
		poll_one(pp, pp->send_cq, &wc, "send");
		if (wc.wr_id != WRID_SEND)
			fail("send completion with unknown wr_id %" PRIu64, wc.wr_id);
		pp->sends_outstanding--;
	}
}

/* What a receive must look like. */
struct expect {
	bool ud;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len;
	bool has_imm;
	uint32_t imm;
};

/* Waits for one receive, checks it and posts a replacement. */
static void receive(struct peer *pp, const struct expect *e)
{
	struct ibv_wc wc;

	poll_one(pp, pp->recv_cq, &wc, "receive");
	if (wc.wr_id != (e->ud ? WRID_UD_RECV : WRID_RC_RECV))
		fail("receive completed on the %s QP, expected the %s QP",
		     wc.wr_id == WRID_UD_RECV ? "UD" : "RC", e->ud ? "UD" : "RC");
	post_recv(pp, e->ud ? pp->ud_qp : pp->qp, wc.wr_id);
	if (wc.opcode != e->opcode)
		fail("receive completion opcode %d, expected %d", wc.opcode, e->opcode);
	if (wc.byte_len != e->byte_len)
		fail("receive of %u bytes, expected %u", wc.byte_len, e->byte_len);
	if (!!(wc.wc_flags & IBV_WC_WITH_IMM) != e->has_imm)
		fail("receive %s immediate data, expected %s", wc.wc_flags & IBV_WC_WITH_IMM
		     ? "with" : "without", e->has_imm ? "some" : "none");
	if (e->has_imm && ntohl(wc.imm_data) != e->imm)
		fail("immediate data %u, expected %u", ntohl(wc.imm_data), e->imm);
	if (e->ud && !(wc.wc_flags & IBV_WC_GRH))
		fail("UD receive without GRH flag");
	if (e->ud && wc.src_qp != pp->remote.ud_qpn)
		fail("UD receive from QP %u, expected %u", wc.src_qp, pp->remote.ud_qpn);
}

/* ---- Running a plan ---- */

static const struct expect control_msg = { .opcode = IBV_WC_RECV, .byte_len = 0 };

/* The message of one op/size/iteration towards the peer; and the matching expectation for
 * the message that comes back. */
static void send_payload(struct peer *pp, enum op op, uint32_t size, uint32_t iter)
{
	switch (op) {
	case OP_SEND:
		post(pp, IBV_WR_SEND, size, 0, false);
		break;
	case OP_SEND_IMM:
		post(pp, IBV_WR_SEND_WITH_IMM, size, iter, false);
		break;
	case OP_WRITE:
		post(pp, IBV_WR_RDMA_WRITE, size, 0, false);
		post(pp, IBV_WR_SEND, 0, 0, false); /* done */
		break;
	case OP_WRITE_IMM:
		post(pp, IBV_WR_RDMA_WRITE_WITH_IMM, size, iter, false);
		break;
	case OP_UD_SEND:
		post(pp, IBV_WR_SEND, size, 0, true);
		break;
	default:
		fail("internal: %s has no payload message", op_names[op]);
	}
}

static void receive_payload(struct peer *pp, enum op op, uint32_t size, uint32_t iter)
{
	struct expect e = { .opcode = IBV_WC_RECV, .byte_len = size };

	switch (op) {
	case OP_SEND:
		break;
	case OP_SEND_IMM:
		e.has_imm = true;
		e.imm = iter;
		break;
	case OP_WRITE:
		e.byte_len = 0;
		break;
	case OP_WRITE_IMM:
		e.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
		e.has_imm = true;
		e.imm = iter;
		break;
	case OP_UD_SEND:
		e.ud = true;
		e.byte_len = size + GRH_LEN;
		break;
	default:
		fail("internal: %s has no payload message", op_names[op]);
	}
	receive(pp, &e);
}

static const uint8_t *payload_at(struct peer *pp, enum op op)
{
	return pp->buf + (op == OP_UD_SEND ? GRH_LEN : 0);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void server_verify_iteration(struct peer *pp, enum op op, uint32_t size, uint32_t i)
{
	if (op == OP_READ) {
		pattern_fill(pp->buf, op, size, i, SERVER_TO_CLIENT);
		post(pp, IBV_WR_SEND, 0, 0, false); /* ready */
		receive(pp, &control_msg);	     /* ack */
		reap_sends(pp, pp->sends_outstanding);
		return;
	}
	pattern_fill(pp->buf + pp->len, op, size, i, SERVER_TO_CLIENT);
	receive_payload(pp, op, size, i);
	verify(payload_at(pp, op), op, size, i, CLIENT_TO_SERVER);
	send_payload(pp, op, size, i);
	reap_sends(pp, pp->sends_outstanding);
}

/* Returns the round-trip time in seconds. */
static double client_verify_iteration(struct peer *pp, enum op op, uint32_t size, uint32_t i)
{
	double t0, rtt;

	if (op == OP_READ) {
		receive(pp, &control_msg); /* ready */
		t0 = now_s();
		post(pp, IBV_WR_RDMA_READ, size, 0, false);
		reap_sends(pp, 1);
		rtt = now_s() - t0;
		verify(pp->buf, op, size, i, SERVER_TO_CLIENT);
		post(pp, IBV_WR_SEND, 0, 0, false); /* ack */
		reap_sends(pp, 1);
		return rtt;
	}
	pattern_fill(pp->buf + pp->len, op, size, i, CLIENT_TO_SERVER);
	t0 = now_s();
	send_payload(pp, op, size, i);
	receive_payload(pp, op, size, i);
	rtt = now_s() - t0;
	reap_sends(pp, pp->sends_outstanding);
	verify(payload_at(pp, op), op, size, i, SERVER_TO_CLIENT);
	return rtt;
}

static void run_verify_step(struct peer *pp, enum op op, uint32_t size, uint32_t iters,
			    struct row *row, double *samples)
{
	double total = 0;

	for (uint32_t i = 0; i < iters; i++) {
		pp->cur_iter = i;
		if (pp->is_server) {
			server_verify_iteration(pp, op, size, i);
		} else {
			double rtt = client_verify_iteration(pp, op, size, i);

			samples[i] = rtt / 2 * 1e6;
			total += rtt;
		}
	}
	if (pp->is_server)
		return;
	/* Payloads per timed interval: two for a round trip, one for a read. */
	double messages = (double)iters * (op == OP_READ ? 1 : 2);
	double sum = 0;

	qsort(samples, iters, sizeof(*samples), cmp_double);
	for (uint32_t i = 0; i < iters; i++)
		sum += samples[i];
	row->has_latency = true;
	row->min_us = samples[0];
	row->max_us = samples[iters - 1];
	row->typical_us = samples[iters / 2];
	row->avg_us = sum / iters;
	row->p99_us = samples[((uint64_t)iters * 99 + 99) / 100 - 1];
	row->mib_s = total > 0 ? messages * size / total / (1 << 20) : 0;
	row->mmsg_s = total > 0 ? messages / total / 1e6 : 0;
}

static void run_bw_step(struct peer *pp, enum op op, uint32_t size, uint32_t n, uint32_t window,
			struct row *row)
{
	enum ibv_wr_opcode opcode = op == OP_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_SEND;

	pp->cur_iter = n - 1;
	if (pp->is_server) {
		if (op == OP_SEND) {
			struct expect e = { .opcode = IBV_WC_RECV, .byte_len = size };

			for (uint32_t i = 0; i < n; i++) {
				pp->cur_iter = i;
				receive(pp, &e);
			}
		} else {
			receive(pp, &control_msg); /* done */
		}
		pp->cur_iter = n - 1;
		verify(pp->buf, op, size, n - 1, CLIENT_TO_SERVER);
		post(pp, IBV_WR_SEND, 0, 0, false); /* ack */
		reap_sends(pp, 1);
		return;
	}

	struct ibv_wc wcs[16];
	uint32_t posted = 0, completed = 0;
	double deadline, t0, t_fill, t_last, elapsed;

	pattern_fill(pp->buf + pp->len, op, size, 0, CLIENT_TO_SERVER);
	t0 = now_s();
	deadline = t0 + pp->timeout_s;
	for (unsigned spins = 0; completed < n - 1; spins++) {
		while (posted < n - 1 && posted - completed < window) {
			pp->cur_iter = posted;
			post(pp, opcode, size, 0, false);
			posted++;
		}
		int got = ibv_poll_cq(pp->send_cq, 16, wcs);

		if (got < 0)
			fail("polling the send CQ failed");
		for (int k = 0; k < got; k++)
			if (wcs[k].status != IBV_WC_SUCCESS)
				fail("send completion %u with status %s", completed + (unsigned)k,
				     ibv_wc_status_str(wcs[k].status));
		completed += (uint32_t)got;
		pp->sends_outstanding -= (unsigned)got;
		if (got > 0)
			deadline = now_s() + pp->timeout_s;
		else if (wait_completion(pp, pp->send_cq, spins)) {
			if (now_s() > deadline)
				fail("no send completion within %.0f s (%u of %u done)",
				     pp->timeout_s, completed, n);
			check_peer(pp);
		}
	}
	t_fill = now_s();
	pp->cur_iter = n - 1;
	pattern_fill(pp->buf + pp->len, op, size, n - 1, CLIENT_TO_SERVER);
	t_last = now_s();
	post(pp, opcode, size, 0, false);
	reap_sends(pp, 1);
	elapsed = (t_fill - t0) + (now_s() - t_last);
	if (op == OP_WRITE) {
		post(pp, IBV_WR_SEND, 0, 0, false); /* done */
		reap_sends(pp, 1);
	}
	receive(pp, &control_msg); /* ack: the server verified the last message */
	row->has_latency = false;
	row->mib_s = elapsed > 0 ? (double)n * size / elapsed / (1 << 20) : 0;
	row->mmsg_s = elapsed > 0 ? (double)n / elapsed / 1e6 : 0;
}

/* The client's messages only; the server verifies each and acknowledges it over TCP, posting
 * no send itself. */
static void run_oneway_step(struct peer *pp, enum op op, uint32_t size, uint32_t iters,
			    struct row *row)
{
	double total = 0;

	for (uint32_t i = 0; i < iters; i++) {
		pp->cur_iter = i;
		if (pp->is_server) {
			receive_payload(pp, op, size, i);
			verify(payload_at(pp, op), op, size, i, CLIENT_TO_SERVER);
			send_line(pp->sock, MAGIC " ack\n");
			continue;
		}
		pattern_fill(pp->buf + pp->len, op, size, i, CLIENT_TO_SERVER);
		double t0 = now_s();

		send_payload(pp, op, size, i);
		reap_sends(pp, pp->sends_outstanding);
		expect_line(pp, "ack");
		total += now_s() - t0;
	}
	row->has_latency = false;
	row->mib_s = total > 0 ? (double)iters * size / total / (1 << 20) : 0;
	row->mmsg_s = total > 0 ? iters / total / 1e6 : 0;
}

static void print_table(const struct row *rows, int nrows)
{
	printf("%-10s %8s %7s %3s %14s %10s %10s %10s %9s\n", "op", "size", "iters", "inl",
	       "lat_typical_us", "lat_avg_us", "lat_p99_us", "MiB/s", "Mmsg/s");
	for (int r = 0; r < nrows; r++) {
		const struct row *w = &rows[r];
		char t[32] = "-", a[32] = "-", p[32] = "-";

		if (w->has_latency) {
			snprintf(t, sizeof(t), "%.2f", w->typical_us);
			snprintf(a, sizeof(a), "%.2f", w->avg_us);
			snprintf(p, sizeof(p), "%.2f", w->p99_us);
		}
		printf("%-10s %8u %7u %3s %14s %10s %10s %10.2f %9.4f\n", op_names[w->op],
		       w->size, w->iters, w->inl ? "y" : "n", t, a, p, w->mib_s, w->mmsg_s);
	}
	fflush(stdout);
}

/* The same shape as vrdma-pingpong's Report (guest-driver/tools/src/pingpong/report.rs). */
static void write_json(const char *path, const struct plan *plan, const struct row *rows,
		       int nrows)
{
	FILE *f = fopen(path, "w");

	if (!f)
		fail("creating %s: %s", path, strerror(errno));
	fprintf(f, "{\n  \"implementation\": \"native\",\n");
	if (plan->window)
		fprintf(f, "  \"mode\": {\n    \"bandwidth\": {\n      \"window\": %u\n    }\n  },\n",
			plan->window);
	else if (plan->oneway)
		fprintf(f, "  \"mode\": \"oneway\",\n");
	else
		fprintf(f, "  \"mode\": \"verify\",\n");
	fprintf(f, "  \"rows\": [");
	for (int r = 0; r < nrows; r++) {
		const struct row *w = &rows[r];

		fprintf(f, "%s\n    {\n      \"op\": \"%s\",\n      \"size\": %u,\n"
			   "      \"iters\": %u,\n      \"inline\": %s,\n",
			r ? "," : "", op_names[w->op], w->size, w->iters, w->inl ? "true" : "false");
		if (w->has_latency)
			fprintf(f, "      \"latency\": {\n        \"min_us\": %.3f,\n"
				   "        \"max_us\": %.3f,\n        \"typical_us\": %.3f,\n"
				   "        \"avg_us\": %.3f,\n        \"p99_us\": %.3f\n      },\n",
				w->min_us, w->max_us, w->typical_us, w->avg_us, w->p99_us);
		else
			fprintf(f, "      \"latency\": null,\n");
		fprintf(f, "      \"mib_s\": %.4f,\n      \"mmsg_s\": %.6f\n    }", w->mib_s,
			w->mmsg_s);
	}
	fprintf(f, "\n  ]\n}\n");
	if (fclose(f))
		fail("writing %s: %s", path, strerror(errno));
}

static int run_plan(struct peer *pp, const char *json)
{
	const struct plan *plan = &pp->local.plan;
	struct row rows[OP_COUNT * MAX_SIZES];
	int nrows = 0;
	double *samples = NULL;

	if (!pp->is_server && !plan->window && !plan->oneway) {
		samples = calloc(plan->iters, sizeof(*samples));
		if (!samples)
			fail("allocating %u samples", plan->iters);
	}
	for (int o = 0; o < plan->nops; o++)
		for (int s = 0; s < plan->nsizes; s++) {
			enum op op = plan->ops[o];
			uint32_t size = plan->sizes[s];
			struct row *row = &rows[nrows];

			if (!step_runs(op, size))
				continue;
			memset(row, 0, sizeof(*row));
			row->op = op;
			row->size = size;
			row->iters = plan->iters;
			row->inl = op != OP_READ &&
				   size <= (op == OP_UD_SEND ? pp->ud_max_inline : pp->max_inline);
			pp->cur_op = op;
			pp->cur_size = size;
			pp->in_step = true;
			if (plan->window)
				run_bw_step(pp, op, size, plan->iters, plan->window, row);
			else if (plan->oneway)
				run_oneway_step(pp, op, size, plan->iters, row);
			else
				run_verify_step(pp, op, size, plan->iters, row, samples);
			pp->in_step = false;
			nrows++;
		}
	free(samples);
	reap_sends(pp, pp->sends_outstanding);
	send_line(pp->sock, MAGIC " done\n");
	expect_line(pp, "done");
	if (pp->is_server) {
		printf("server: %d steps of %u iterations verified\n", nrows, plan->iters);
		return 0;
	}
	print_table(rows, nrows);
	if (json)
		write_json(json, plan, rows, nrows);
	return 0;
}

/* ---- Command line ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: vrdma-native-pingpong server|client [options]\n"
		"       vrdma-native-pingpong selftest\n"
		"  -d, --device DEV     RDMA device (default: the first)\n"
		"  -p, --port PORT      TCP port of the exchange (default %d)\n"
		"  -H, --host HOST      address to listen on / connect to (default 127.0.0.1)\n"
		"  -o, --ops OPS        send,send_imm,write,write_imm,read,ud_send (default all)\n"
		"  -s, --sizes SIZES    comma-separated sizes in bytes (default 1,64,4096,65536,1048576)\n"
		"  -n, --iters N        iterations (messages in --bw) per op and size (default 100)\n"
		"  -b, --bw             bandwidth mode (send and write only)\n"
		"  -w, --window W       outstanding messages in --bw (default 16)\n"
		"  -O, --oneway         one-way mode: only the client sends (not read); the server\n"
		"                       verifies and acknowledges each message over TCP\n"
		"  -S, --start-file F   once the QPs are ready (READY on stderr), wait for F to exist\n"
		"  -l, --len BYTES      area size: the server refuses plans needing more, the client\n"
		"                       uses at least its plan's (default: this side's plan's)\n"
		"  -t, --timeout SECS   bound of every wait (default 30)\n"
		"  -M, --mtu BYTES      RC path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)\n"
		"  -T, --qp-timeout N   RC local ACK timeout, 4.096 us * 2^N (default 14)\n"
		"  -R, --retry-cnt N    RC transport retries, 0-7 (default 7)\n"
		"  -r, --rnr-retry N    RC RNR retries, 0-7, 7 = for ever (default 7)\n"
		"  -m, --min-rnr-timer N  RNR NAK timer asked of the peer, IB encoding 0-31 (default 12)\n"
		"  -A, --receives-after F  post the RC receives only once F exists (after ready);\n"
		"                       the peer's sends meet RNR NAKs until then\n"
		"  -E, --events         wait for completions by sleeping on completion events\n"
		"                       (arm, poll once more, sleep) instead of busy polling\n"
		"  -j, --json FILE      also write the results as JSON (client)\n",
		DEFAULT_PORT);
}

/* Checks the pattern definition against the vector pinned in pattern.rs. */
static int selftest(void)
{
	static const char want[] = "2cc4acbf7b7092b9d10c775836";
	uint8_t v[13];
	char hex[2 * sizeof(v) + 1];
	char err[256];
	struct plan p;
	struct hello h;

	pattern_fill(v, OP_WRITE_IMM, 13, 7, SERVER_TO_CLIENT);
	for (size_t i = 0; i < sizeof(v); i++)
		snprintf(hex + 2 * i, 3, "%02x", v[i]);
	if (strcmp(hex, want) || splitmix64(0) != 0xE220A8397B1DCDAFull) {
		fprintf(stderr, "selftest: pattern %s, expected %s\n", hex, want);
		return 1;
	}
	const char *line = MAGIC " qpn=11 psn=abcdef gid=fe80000000000000021122fffe334455 "
			   "rkey=1234 addr=7f00dead0000 len=1048576 plan=send,read:1,4096:100:verify";
	char again[MAX_LINE];

	if (!parse_hello(line, &h, err, sizeof(err))) {
		fprintf(stderr, "selftest: %s\n", err);
		return 1;
	}
	format_hello(&h, again, sizeof(again));
	if (strncmp(again, line, strlen(line)) || again[strlen(line)] != '\n') {
		fprintf(stderr, "selftest: hello does not round-trip: %s", again);
		return 1;
	}
	static const char *const bad[] = {
		"send:1:1", "send:0:1:verify", "send,send:1:1:verify", "read:1:1:bw4",
		"ud_send:2048:1:verify", "send:1:1:bw129", "send,:1:1:verify", "read:1:1:oneway",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (plan_from_wire(bad[i], strlen(bad[i]), &p, err, sizeof(err))) {
			fprintf(stderr, "selftest: plan %s accepted\n", bad[i]);
			return 1;
		}
	if (!plan_from_wire("write,send_imm:64:5:oneway", 26, &p, err, sizeof(err)) || !p.oneway) {
		fprintf(stderr, "selftest: one-way plan refused: %s\n", err);
		return 1;
	}
	printf("selftest: ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "device", required_argument, NULL, 'd' }, { "port", required_argument, NULL, 'p' },
		{ "host", required_argument, NULL, 'H' },   { "ops", required_argument, NULL, 'o' },
		{ "sizes", required_argument, NULL, 's' },  { "iters", required_argument, NULL, 'n' },
		{ "bw", no_argument, NULL, 'b' },	    { "window", required_argument, NULL, 'w' },
		{ "len", required_argument, NULL, 'l' },    { "timeout", required_argument, NULL, 't' },
		{ "json", required_argument, NULL, 'j' },   { "help", no_argument, NULL, 'h' },
		{ "oneway", no_argument, NULL, 'O' },	    { "start-file", required_argument, NULL, 'S' },
		{ "mtu", required_argument, NULL, 'M' },    { "qp-timeout", required_argument, NULL, 'T' },
		{ "retry-cnt", required_argument, NULL, 'R' },
		{ "rnr-retry", required_argument, NULL, 'r' },
		{ "min-rnr-timer", required_argument, NULL, 'm' },
		{ "receives-after", required_argument, NULL, 'A' },
		{ "events", no_argument, NULL, 'E' },
		{ 0 },
	};
	const char *device = NULL, *host = "127.0.0.1", *json = NULL, *start_file = NULL;
	const char *receives_after = NULL;
	const char *ops = "send,send_imm,write,write_imm,read,ud_send";
	const char *sizes = "1,64,4096,65536,1048576";
	char port[16], err[512], wire[MAX_LINE], line[MAX_LINE];
	unsigned long iters = 100, window = 16, timeout = 30;
	uint64_t len = 0;
	bool bw = false, oneway = false;
	struct peer peer = { .sock = -1, .path_mtu = IBV_MTU_1024, .qp_timeout = 14, .retry_cnt = 7 };
	unsigned long mtu = 1024, qp_timeout = 14, retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 12;
	struct plan plan;
	int c;

	snprintf(port, sizeof(port), "%d", DEFAULT_PORT);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "selftest"))
		return selftest();
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "server") && strcmp(argv[1], "client")) {
		usage(stderr);
		return 2;
	}
	peer.is_server = !strcmp(argv[1], "server");
	optind = 2;
	while ((c = getopt_long(argc, argv, "d:p:H:o:s:n:bw:l:t:j:hOS:M:T:R:r:m:A:E", longopts, NULL)) != -1) {
		switch (c) {
		case 'd': device = optarg; break;
		case 'p': snprintf(port, sizeof(port), "%s", optarg); break;
		case 'H': host = optarg; break;
		case 'o': ops = optarg; break;
		case 's': sizes = optarg; break;
		case 'n': iters = strtoul(optarg, NULL, 10); break;
		case 'b': bw = true; break;
		case 'w': window = strtoul(optarg, NULL, 10); break;
		case 'l': len = strtoull(optarg, NULL, 10); break;
		case 't': timeout = strtoul(optarg, NULL, 10); break;
		case 'j': json = optarg; break;
		case 'O': oneway = true; break;
		case 'S': start_file = optarg; break;
		case 'M': mtu = strtoul(optarg, NULL, 10); break;
		case 'T': qp_timeout = strtoul(optarg, NULL, 10); break;
		case 'R': retry_cnt = strtoul(optarg, NULL, 10); break;
		case 'r': rnr_retry = strtoul(optarg, NULL, 10); break;
		case 'm': min_rnr_timer = strtoul(optarg, NULL, 10); break;
		case 'A': receives_after = optarg; break;
		case 'E': peer.use_events = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc || timeout == 0 || (bw && oneway) || qp_timeout > 31 || retry_cnt > 7 ||
	    rnr_retry > 7 || min_rnr_timer > 31) {
		usage(stderr);
		return 2;
	}
	switch (mtu) {
	case 256: peer.path_mtu = IBV_MTU_256; break;
	case 512: peer.path_mtu = IBV_MTU_512; break;
	case 1024: peer.path_mtu = IBV_MTU_1024; break;
	case 2048: peer.path_mtu = IBV_MTU_2048; break;
	case 4096: peer.path_mtu = IBV_MTU_4096; break;
	default: usage(stderr); return 2;
	}
	peer.qp_timeout = (uint8_t)qp_timeout;
	peer.retry_cnt = (uint8_t)retry_cnt;
	peer.rnr_retry = (uint8_t)rnr_retry;
	peer.min_rnr_timer = (uint8_t)min_rnr_timer;
	peer.hold_receives = receives_after != NULL;
	peer.timeout_s = (double)timeout;
	snprintf(wire, sizeof(wire), "%s:%s:%lu:", ops, sizes, iters);
	if (bw)
		snprintf(wire + strlen(wire), sizeof(wire) - strlen(wire), "bw%lu", window);
	else if (oneway)
		snprintf(wire + strlen(wire), sizeof(wire) - strlen(wire), "oneway");
	else
		snprintf(wire + strlen(wire), sizeof(wire) - strlen(wire), "verify");
	if (!plan_from_wire(wire, strlen(wire), &plan, err, sizeof(err)))
		fail("%s", err);
	/* The server's area is --len if given; the client's is at least what its plan needs. */
	if (!len || (!peer.is_server && len < plan_area_len(&plan)))
		len = plan_area_len(&plan);
	current_peer = &peer;

	if (peer.is_server) {
		peer.sock = tcp_accept(host, port, peer.timeout_s);
		receive_line(&peer, line);
		if (!parse_hello(line, &peer.remote, err, sizeof(err)))
			fail("bad hello from the client: %s", err);
		if (plan_area_len(&peer.remote.plan) > len) {
			plan_to_wire(&peer.remote.plan, wire, sizeof(wire));
			fail("refusing plan %s: it needs an area of %" PRIu64
			     " bytes, this server has %" PRIu64 " (see --len)",
			     wire, plan_area_len(&peer.remote.plan), len);
		}
		if (peer.remote.len < plan_area_len(&peer.remote.plan))
			fail("client area of %" PRIu64 " bytes is too small for its plan",
			     peer.remote.len);
		plan = peer.remote.plan;
		setup(&peer, &plan, len, device);
	} else {
		setup(&peer, &plan, len, device);
		peer.sock = tcp_connect(host, port, peer.timeout_s);
		format_hello(&peer.local, line, sizeof(line));
		send_line(peer.sock, line);
		receive_line(&peer, line);
		if (!parse_hello(line, &peer.remote, err, sizeof(err)))
			fail("bad hello from the server: %s", err);
		if (!plan_equal(&peer.remote.plan, &plan))
			fail("server answered with a different plan");
		if (peer.remote.len < plan_area_len(&plan))
			fail("server area of %" PRIu64 " bytes is too small for the plan",
			     peer.remote.len);
	}
	if (peer.is_server) {
		format_hello(&peer.local, line, sizeof(line));
		send_line(peer.sock, line);
	}
	connect_qps(&peer);
	fprintf(stderr, "READY\n");
	if (start_file) {
		double deadline = now_s() + peer.timeout_s;

		while (access(start_file, F_OK)) {
			if (now_s() > deadline)
				fail("start file %s did not appear within %.0f s", start_file,
				     peer.timeout_s);
			usleep(20000);
		}
	}
	send_line(peer.sock, MAGIC " ready\n");
	expect_line(&peer, "ready");
	fprintf(stderr, "RUNNING\n");
	if (receives_after) {
		/* The peer's first sends meet RNR NAKs meanwhile; a peer that gives up says so. */
		double deadline = now_s() + peer.timeout_s;

		while (access(receives_after, F_OK)) {
			check_peer(&peer);
			if (now_s() > deadline)
				fail("file %s did not appear within %.0f s", receives_after,
				     peer.timeout_s);
			usleep(20000);
		}
		post_rc_receives(&peer);
		fprintf(stderr, "RECEIVES POSTED\n");
	}
	run_plan(&peer, json);
	teardown(&peer);
	close(peer.sock);
	return 0;
}
