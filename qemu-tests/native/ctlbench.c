// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * vrdma-native-ctlbench: the native side of `vrdma-vm bench`'s control-path and doorbell
 * benches, over rdma-core's libibverbs directly on a device.
 *
 * It does what guest-driver/tools/src/bin/vrdma-ctlbench.rs does through vrdma (keep the two in
 * step: same objects, same sizes, same attributes, same output), so that the two can be
 * compared in one boot of the rxe VM.
 *
 *   vrdma-native-ctlbench control [-d DEV] [-r REPS] [-m MR_BYTES] [-R MR_REPS] [-H] [-S]
 *   vrdma-native-ctlbench scale [-d DEV] [-q QPS] [-n MESSAGES] [-w WINDOW] [-s SIZE]
 *                               [-y READY_FILE -g START_FILE]
 *
 * -H registers memory of 2 MiB hugetlb pages; -S registers a shared memfd's pages (the memory
 * a vhost-user VM's RAM is) instead of private anonymous memory.
 *
 * Output (stdout): one JSON object, {"samples_ns": {"NAME": [ns, ...], ...}, ...}; the
 * harness (qemu-tests/src/bench/) computes the statistics.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define PORT_NUM 1
#define GID_INDEX 0
/* Queue sizes of the QPs both benches create (as vrdma-ctlbench). */
#define CTL_CQE 64
#define CTL_WR 16
/* Most outstanding sends on one QP of the scale bench. */
#define SCALE_QP_DEPTH 16
#define MAX_RD_ATOMIC 16

static void __attribute__((noreturn, format(printf, 1, 2))) fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "vrdma-native-ctlbench: error: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void __attribute__((noreturn)) usage(void)
{
	fprintf(stderr,
		"usage: vrdma-native-ctlbench control [-d DEV] [-r REPS] [-m MR_BYTES] [-R MR_REPS] [-H] "
		"[-S]\n"
		"       vrdma-native-ctlbench scale [-d DEV] [-q QPS] [-n MESSAGES] [-w WINDOW] "
		"[-s SIZE] [-y READY_FILE -g START_FILE]\n");
	exit(2);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static unsigned long parse_number(const char *text, unsigned long min, unsigned long max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(text, &end, 10);
	if (errno || end == text || *end || v < min || v > max)
		fail("%s is not a number in %lu..=%lu", text, min, max);
	return v;
}

/* ---- Samples, printed as JSON arrays ---- */

struct series {
	const char *name;
	uint64_t *ns;
	size_t len, cap;
};

static void series_init(struct series *s, const char *name, size_t cap)
{
	s->name = name;
	s->len = 0;
	s->cap = cap;
	s->ns = calloc(cap ? cap : 1, sizeof(*s->ns));
	if (!s->ns)
		fail("out of memory");
}

static void series_push(struct series *s, uint64_t ns)
{
	if (s->len == s->cap)
		fail("series %s overflows (%zu samples)", s->name, s->cap);
	s->ns[s->len++] = ns;
}

static void print_series(const struct series *all, size_t n)
{
	printf("\"samples_ns\":{");
	for (size_t i = 0; i < n; i++) {
		printf("%s\"%s\":[", i ? "," : "", all[i].name);
		for (size_t j = 0; j < all[i].len; j++)
			printf("%s%" PRIu64, j ? "," : "", all[i].ns[j]);
		printf("]");
	}
	printf("}");
}

/* ---- Device ---- */

struct device {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
	uint8_t max_rd_atomic, max_dest_rd_atomic;
};

static void open_device(struct device *d, const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device_attr attr;

	if (!list)
		fail("listing RDMA devices: %s", strerror(errno));
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			d->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!d->ctx)
		fail("cannot open RDMA device %s", name);
	if (ibv_query_device(d->ctx, &attr))
		fail("querying %s", name);
	d->max_rd_atomic = attr.max_qp_init_rd_atom < MAX_RD_ATOMIC ?
				   (uint8_t)attr.max_qp_init_rd_atom : MAX_RD_ATOMIC;
	d->max_dest_rd_atomic =
		attr.max_qp_rd_atom < MAX_RD_ATOMIC ? (uint8_t)attr.max_qp_rd_atom : MAX_RD_ATOMIC;
	if (ibv_query_gid(d->ctx, PORT_NUM, GID_INDEX, &d->gid))
		fail("querying GID %d of %s", GID_INDEX, name);
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd)
		fail("allocating a PD: %s", strerror(errno));
}

static struct ibv_cq *create_cq(struct device *d, int cqe)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, cqe, NULL, NULL, 0);

	if (!cq)
		fail("creating a CQ of %d entries: %s", cqe, strerror(errno));
	return cq;
}

static struct ibv_qp *create_qp(struct device *d, struct ibv_cq *cq, uint32_t send_wr,
				uint32_t recv_wr)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = send_wr, .max_recv_wr = recv_wr,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(d->pd, &init);

	if (!qp)
		fail("creating a QP: %s", strerror(errno));
	return qp;
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, const char *state)
{
	int err = ibv_modify_qp(qp, attr, mask);

	if (err)
		fail("moving QP %u to %s: %s", qp->qp_num, state, strerror(err));
}

/* The three transitions with the attributes of vrdma's ConnectOptions::default(). */
static void to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = PORT_NUM,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ,
	};

	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
	       "INIT");
}

static void to_rtr(struct device *d, struct ibv_qp *qp, uint32_t remote_qpn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = remote_qpn,
		.rq_psn = 0,
		.max_dest_rd_atomic = d->max_dest_rd_atomic,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1,
			     .grh = { .dgid = d->gid, .sgid_index = GID_INDEX, .hop_limit = 64 },
			     .port_num = PORT_NUM },
	};

	modify(qp, &a,
	       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	       "RTR");
}

static void to_rts(struct device *d, struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTS,
		.sq_psn = 0,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.max_rd_atomic = d->max_rd_atomic,
	};

	modify(qp, &a,
	       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
	       "RTS");
}

/* ---- control: per-object costs ---- */

enum { S_CREATE_CQ, S_DESTROY_CQ, S_CREATE_QP, S_DESTROY_QP, S_TO_INIT, S_TO_RTR, S_TO_RTS,
       S_SETUP_QP, S_REG_MR, S_DEREG_MR, S_COUNT };
static const char *const series_names[S_COUNT] = {
	"create_cq", "destroy_cq", "create_qp", "destroy_qp", "modify_init",
	"modify_rtr", "modify_rts", "setup_qp", "reg_mr", "dereg_mr",
};

/* QPs one setup repetition brings from nothing to RTS, and repetitions (as vrdma-ctlbench). */
#define SETUP_QPS 32
#define SETUP_REPS 3

/* `bytes` of private anonymous memory, or with `shared` of a memfd mapped shared; of 2 MiB
 * hugetlb pages with `huge`. */
static uint8_t *map_buffer(unsigned long bytes, bool huge, bool shared)
{
	uint8_t *buf;

	if (shared) {
		int fd = memfd_create("vrdma-native-ctlbench", MFD_CLOEXEC | (huge ? MFD_HUGETLB : 0));

		if (fd < 0)
			fail("memfd_create: %s", strerror(errno));
		if (ftruncate(fd, (off_t)bytes))
			fail("sizing the memfd to %lu bytes: %s", bytes, strerror(errno));
		buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
	} else {
		buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | (huge ? MAP_HUGETLB : 0), -1, 0);
	}
	if (buf == MAP_FAILED)
		fail("allocating %lu bytes%s: %s", bytes, huge ? " of huge pages" : "",
		     strerror(errno));
	if (!huge && madvise(buf, bytes, MADV_NOHUGEPAGE))
		fail("madvise(MADV_NOHUGEPAGE): %s", strerror(errno));
	return buf;
}

static void control(struct device *d, unsigned long reps, unsigned long mr_bytes,
		    unsigned long mr_reps, bool huge, bool shared)
{
	struct series s[S_COUNT];
	struct ibv_cq *cq;
	uint64_t t0, t1, t2;

	for (int i = 0; i < S_COUNT; i++)
		series_init(&s[i], series_names[i],
			    i >= S_REG_MR ? mr_reps : i == S_SETUP_QP ? SETUP_REPS : reps);

	for (unsigned long r = 0; r < reps; r++) {
		t0 = now_ns();
		cq = create_cq(d, CTL_CQE);
		t1 = now_ns();
		if (ibv_destroy_cq(cq))
			fail("destroying a CQ");
		t2 = now_ns();
		series_push(&s[S_CREATE_CQ], t1 - t0);
		series_push(&s[S_DESTROY_CQ], t2 - t1);
	}

	cq = create_cq(d, CTL_CQE);
	for (unsigned long r = 0; r < reps; r++) {
		struct ibv_qp *qp;
		uint64_t t3, t4, t5;

		t0 = now_ns();
		qp = create_qp(d, cq, CTL_WR, CTL_WR);
		t1 = now_ns();
		to_init(qp);
		t2 = now_ns();
		/* Towards itself: the transition does the same work for any peer. */
		to_rtr(d, qp, qp->qp_num);
		t3 = now_ns();
		to_rts(d, qp);
		t4 = now_ns();
		if (ibv_destroy_qp(qp))
			fail("destroying a QP");
		t5 = now_ns();
		series_push(&s[S_CREATE_QP], t1 - t0);
		series_push(&s[S_TO_INIT], t2 - t1);
		series_push(&s[S_TO_RTR], t3 - t2);
		series_push(&s[S_TO_RTS], t4 - t3);
		series_push(&s[S_DESTROY_QP], t5 - t4);
	}
	/* Setup rate: SETUP_QPS QPs created, then each brought to RTS (towards itself). */
	for (int r = 0; r < SETUP_REPS; r++) {
		struct ibv_qp *qps[SETUP_QPS];

		t0 = now_ns();
		for (int i = 0; i < SETUP_QPS; i++)
			qps[i] = create_qp(d, cq, CTL_WR, CTL_WR);
		for (int i = 0; i < SETUP_QPS; i++) {
			to_init(qps[i]);
			to_rtr(d, qps[i], qps[i]->qp_num);
			to_rts(d, qps[i]);
		}
		t1 = now_ns();
		for (int i = 0; i < SETUP_QPS; i++)
			if (ibv_destroy_qp(qps[i]))
				fail("destroying a QP");
		series_push(&s[S_SETUP_QP], (t1 - t0) / SETUP_QPS);
	}
	if (ibv_destroy_cq(cq))
		fail("destroying a CQ");

	/* Ordinary pages (no transparent huge pages either), or 2 MiB hugetlb pages: the two
	 * kinds of guest RAM the vrdma side is measured with. */
	uint8_t *buf = map_buffer(mr_bytes, huge, shared);
	/* Fault the pages in first: the bench times registration, not page allocation. */
	memset(buf, 0x5a, mr_bytes);
	for (unsigned long r = 0; r < mr_reps; r++) {
		struct ibv_mr *mr;

		t0 = now_ns();
		mr = ibv_reg_mr(d->pd, buf, mr_bytes,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					IBV_ACCESS_REMOTE_READ);
		t1 = now_ns();
		if (!mr)
			fail("registering %lu bytes: %s", mr_bytes, strerror(errno));
		if (ibv_dereg_mr(mr))
			fail("deregistering an MR");
		t2 = now_ns();
		series_push(&s[S_REG_MR], t1 - t0);
		series_push(&s[S_DEREG_MR], t2 - t1);
	}
	munmap(buf, mr_bytes);

	printf("{\"mr_bytes\":%lu,", mr_bytes);
	print_series(s, S_COUNT);
	printf("}\n");
}

/* ---- scale: the cost of posting one send with many QPs open ---- */

static bool exists(const char *path)
{
	return access(path, F_OK) == 0;
}

static void touch(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);

	if (fd < 0)
		fail("creating %s: %s", path, strerror(errno));
	close(fd);
}

/* Waits for one completion (busy polling) and returns the index of its QP. */
static uint32_t reap(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;

	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0)
		fail("polling the send CQ");
	if (wc.status != IBV_WC_SUCCESS)
		fail("send on QP %" PRIu64 " completed with %s", wc.wr_id,
		     ibv_wc_status_str(wc.status));
	return (uint32_t)wc.wr_id;
}

static void scale(struct device *d, uint32_t nqps, unsigned long messages, uint32_t window,
		  uint32_t size, const char *ready_file, const char *start_file)
{
	size_t area = (size_t)nqps * size;
	uint8_t *buf = calloc(2, area);
	struct ibv_qp **qps = calloc(nqps, sizeof(*qps));
	struct ibv_qp **peers = calloc(nqps, sizeof(*peers));
	uint32_t *outstanding = calloc(nqps, sizeof(*outstanding));
	struct series post;
	uint64_t setup_start = now_ns(), setup_ns, elapsed_ns, t0, t1;
	uint32_t in_flight = 0;

	if (!buf || !qps || !peers || !outstanding)
		fail("out of memory");
	series_init(&post, "post_send", messages);
	/* One MR: the first half is the sources, the second the destinations. */
	struct ibv_mr *mr = ibv_reg_mr(d->pd, buf, 2 * area,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		fail("registering %zu bytes: %s", 2 * area, strerror(errno));
	struct ibv_cq *send_cq = create_cq(d, (int)window);
	struct ibv_cq *peer_cq = create_cq(d, 1);
	for (uint32_t i = 0; i < nqps; i++) {
		qps[i] = create_qp(d, send_cq, SCALE_QP_DEPTH, 1);
		peers[i] = create_qp(d, peer_cq, 1, 1);
	}
	for (uint32_t i = 0; i < nqps; i++) {
		to_init(qps[i]);
		to_rtr(d, qps[i], peers[i]->qp_num);
		to_rts(d, qps[i]);
		to_init(peers[i]);
		to_rtr(d, peers[i], qps[i]->qp_num);
		to_rts(d, peers[i]);
	}

	struct ibv_sge sge = { .length = size, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma.rkey = mr->rkey,
	}, *bad;

	/* Warm-up: one message on every QP, so that first touches of queue pages are not timed. */
	for (uint32_t i = 0; i < nqps; i++) {
		sge.addr = (uintptr_t)buf + (size_t)i * size;
		wr.wr.rdma.remote_addr = (uintptr_t)buf + area + (size_t)i * size;
		wr.wr_id = i;
		if (ibv_post_send(qps[i], &wr, &bad))
			fail("posting a warm-up write on QP %u", i);
		reap(send_cq);
	}
	setup_ns = now_ns() - setup_start;
	if (ready_file && start_file) {
		touch(ready_file);
		while (!exists(start_file))
			usleep(1000);
	}

	/* Round robin over the QPs, at most `window` in flight, SCALE_QP_DEPTH per QP. */
	uint64_t start = now_ns();
	for (unsigned long m = 0; m < messages; m++) {
		uint32_t i = (uint32_t)(m % nqps);

		while (in_flight >= window || outstanding[i] >= SCALE_QP_DEPTH) {
			outstanding[reap(send_cq)]--;
			in_flight--;
		}
		sge.addr = (uintptr_t)buf + (size_t)i * size;
		wr.wr.rdma.remote_addr = (uintptr_t)buf + area + (size_t)i * size;
		wr.wr_id = i;
		t0 = now_ns();
		int err = ibv_post_send(qps[i], &wr, &bad);
		t1 = now_ns();
		if (err)
			fail("posting a write on QP %u: %s", i, strerror(err));
		series_push(&post, t1 - t0);
		outstanding[i]++;
		in_flight++;
	}
	while (in_flight) {
		outstanding[reap(send_cq)]--;
		in_flight--;
	}
	elapsed_ns = now_ns() - start;

	printf("{\"qps\":%u,\"messages\":%lu,\"size\":%u,\"window\":%u,\"setup_ns\":%" PRIu64
	       ",\"elapsed_ns\":%" PRIu64 ",",
	       nqps, messages, size, window, setup_ns, elapsed_ns);
	print_series(&post, 1);
	printf("}\n");

	for (uint32_t i = 0; i < nqps; i++) {
		ibv_destroy_qp(qps[i]);
		ibv_destroy_qp(peers[i]);
	}
	ibv_destroy_cq(send_cq);
	ibv_destroy_cq(peer_cq);
	ibv_dereg_mr(mr);
	free(buf);
	free(qps);
	free(peers);
	free(outstanding);
}

int main(int argc, char **argv)
{
	const char *dev = "rxe0", *ready_file = NULL, *start_file = NULL;
	unsigned long reps = 50, mr_bytes = 256ul << 20, mr_reps = 3;
	unsigned long qps = 1, messages = 4000, window = 16, size = 64;
	bool is_control;
	int opt;
	bool huge = false, shared = false;

	if (argc < 2)
		usage();
	if (!strcmp(argv[1], "control"))
		is_control = true;
	else if (!strcmp(argv[1], "scale"))
		is_control = false;
	else
		usage();
	optind = 2;
	while ((opt = getopt(argc, argv, "d:r:m:R:HSq:n:w:s:y:g:")) != -1) {
		switch (opt) {
		case 'H': huge = true; break;
		case 'S': shared = true; break;
		case 'd': dev = optarg; break;
		case 'r': reps = parse_number(optarg, 1, 1000000); break;
		case 'm': mr_bytes = parse_number(optarg, 4096, 1ul << 40); break;
		case 'R': mr_reps = parse_number(optarg, 1, 1000); break;
		case 'q': qps = parse_number(optarg, 1, 65536); break;
		case 'n': messages = parse_number(optarg, 1, 100000000); break;
		case 'w': window = parse_number(optarg, 1, 4096); break;
		case 's': size = parse_number(optarg, 1, 1u << 20); break;
		case 'y': ready_file = optarg; break;
		case 'g': start_file = optarg; break;
		default: usage();
		}
	}
	if (optind != argc || !ready_file != !start_file)
		usage();

	struct device d = { 0 };

	open_device(&d, dev);
	if (is_control)
		control(&d, reps, mr_bytes, mr_reps, huge, shared);
	else
		scale(&d, (uint32_t)qps, messages, (uint32_t)window, (uint32_t)size, ready_file,
		      start_file);
	fflush(stdout);
	ibv_dealloc_pd(d.pd);
	ibv_close_device(d.ctx);
	return 0;
}
