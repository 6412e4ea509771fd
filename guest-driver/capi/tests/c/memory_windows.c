/* Memory windows on the first device, between two RC QPs of this process (A and B, one PD):
 *
 *   - a type-1 window bound with ibv_bind_mw on B, a type-2 window bound with an
 *     IBV_WR_BIND_MW request on B; each opening part of one MR (registered with MW_BIND);
 *   - A writes and reads through each window's rkey, every byte verified; the type-1 window,
 *     bound again read-only under its next key, still reads, and a write through it fails
 *     with IBV_WC_REM_ACCESS_ERR (rxe checks an access through a window against the window's
 *     rights but against the MR's range, not the window's, so the range is not tested);
 *   - the type-2 window is invalidated by B's IBV_WR_LOCAL_INV, then (bound again) by A's
 *     IBV_WR_SEND_WITH_INV, whose receive names the invalidated rkey; after each, A's next
 *     access through it fails with IBV_WC_REM_ACCESS_ERR.
 *
 * Plain rdma-core API: runs natively on rxe and over vrdma (whose back-end must offer memory
 * windows: vrdma-backend --allow-memory-windows). Exits 0 on success, after printing
 * "memory windows: all passed".
 *
 * cc -std=gnu11 -Wall -Wextra -Werror memory_windows.c -libverbs */
#include <time.h>

#include "verbs_test.h"

#define WINDOW 4096
#define MSG 64
#define WINDOW_ACCESS (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

static union ibv_gid gid;
static enum ibv_mtu mtu;

static struct ibv_wc poll_one(struct ibv_cq *cq, const char *what)
{
	struct timespec start, now;
	struct ibv_wc wc;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "%s: ibv_poll_cq", what);
		if (n == 1)
			return wc;
		clock_gettime(CLOCK_MONOTONIC, &now);
		CHECK(now.tv_sec - start.tv_sec < HANG_BOUND_S, "%s: no completion within %d s", what,
		      HANG_BOUND_S);
	}
}

static void expect_success(struct ibv_cq *cq, enum ibv_wc_opcode opcode, const char *what)
{
	struct ibv_wc wc = poll_one(cq, what);
	CHECK(wc.status == IBV_WC_SUCCESS, "%s: status %s", what, ibv_wc_status_str(wc.status));
	CHECK(wc.opcode == opcode, "%s: opcode %d, expected %d", what, wc.opcode, opcode);
	printf("%s: completed\n", what);
}

static struct ibv_pd *pd;

/* A fresh pair of connected RC QPs on the sides' CQs. */
static void open_pair(struct side *a, struct side *b)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	init.send_cq = init.recv_cq = a->cq;
	a->qp = ibv_create_qp(pd, &init);
	init.send_cq = init.recv_cq = b->cq;
	b->qp = ibv_create_qp(pd, &init);
	CHECK(a->qp && b->qp, "create QPs");
	connect_qp(a->qp, b->qp->qp_num, &gid, mtu);
	connect_qp(b->qp, a->qp->qp_num, &gid, mtu);
}

/* An access error moves RC QPs to ERROR: the next step takes a new pair (no type-2 window is
 * bound through the old one by then). */
static void replace_pair(struct side *a, struct side *b)
{
	struct ibv_wc drain;
	CHECK(ibv_destroy_qp(a->qp) == 0 && ibv_destroy_qp(b->qp) == 0, "destroy QPs");
	while (ibv_poll_cq(a->cq, 1, &drain) > 0)
		;
	while (ibv_poll_cq(b->cq, 1, &drain) > 0)
		;
	open_pair(a, b);
}

/* A's RDMA WRITE or READ of `len` bytes at `remote` through `rkey`, to or from `local`. */
static enum ibv_wc_status rdma(struct side *a, enum ibv_wr_opcode opcode, struct ibv_mr *local,
			       size_t offset, uint64_t remote, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)local->addr + offset,
		.length = len,
		.lkey = local->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = 1,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = opcode,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post RDMA %d", opcode);
	return poll_one(a->cq, "RDMA through a window").status;
}

/* Writes then reads `WINDOW` bytes through `rkey` at `remote` (the start of `target`'s part
 * at `target_offset`), verifying every byte both ways. */
static void write_and_read(struct side *a, struct ibv_mr *src, struct ibv_mr *dst,
			   unsigned char *target, size_t target_offset, uint64_t remote,
			   uint32_t rkey, unsigned seed, const char *what)
{
	char label[96];
	fill(src->addr, WINDOW, seed);
	memset(dst->addr, 0, WINDOW);
	CHECK(rdma(a, IBV_WR_RDMA_WRITE, src, 0, remote, rkey, WINDOW) == IBV_WC_SUCCESS,
	      "%s: RDMA WRITE through the window", what);
	snprintf(label, sizeof(label), "%s: RDMA WRITE", what);
	expect_same(target + target_offset, src->addr, WINDOW, label);
	CHECK(rdma(a, IBV_WR_RDMA_READ, dst, 0, remote, rkey, WINDOW) == IBV_WC_SUCCESS,
	      "%s: RDMA READ through the window", what);
	snprintf(label, sizeof(label), "%s: RDMA READ", what);
	expect_same(dst->addr, src->addr, WINDOW, label);
}

static void expect_access_error(struct side *a, struct ibv_mr *src, uint64_t remote,
				uint32_t rkey, const char *what)
{
	enum ibv_wc_status status = rdma(a, IBV_WR_RDMA_WRITE, src, 0, remote, rkey, MSG);
	CHECK(status == IBV_WC_REM_ACCESS_ERR, "%s: status %s, expected remote access error",
	      what, ibv_wc_status_str(status));
	printf("%s: IBV_WC_REM_ACCESS_ERR\n", what);
}

/* A's RDMA READ of the `WINDOW` bytes at `remote` through `rkey`, compared with `expected`. */
static void read_back(struct side *a, struct ibv_mr *dst, const unsigned char *expected,
		      uint64_t remote, uint32_t rkey, const char *what)
{
	memset(dst->addr, 0, WINDOW);
	CHECK(rdma(a, IBV_WR_RDMA_READ, dst, 0, remote, rkey, WINDOW) == IBV_WC_SUCCESS,
	      "%s: RDMA READ through the window", what);
	expect_same(dst->addr, expected, WINDOW, what);
}

/* B binds the type-1 window over `[addr, addr + WINDOW)` of `mr` with `access`: the window
 * moves to ibv_inc_rkey of its key. */
static void bind_type1(struct side *b, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t addr,
		       unsigned access)
{
	uint32_t before = mw->rkey;
	struct ibv_mw_bind bind = {
		.wr_id = 3,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = addr, .length = WINDOW,
			       .mw_access_flags = access },
	};
	errno = ibv_bind_mw(b->qp, mw, &bind);
	CHECK(errno == 0, "ibv_bind_mw");
	CHECK(mw->rkey == ibv_inc_rkey(before), "type-1 rkey %#x, expected %#x", mw->rkey,
	      ibv_inc_rkey(before));
	expect_success(b->cq, IBV_WC_BIND_MW, "type-1 bind (ibv_bind_mw)");
}

/* B binds the type-2 window over `[addr, addr + WINDOW)` of `mr` with an IBV_WR_BIND_MW
 * request under its next key, which the application records in mw->rkey. */
static void bind_type2(struct side *b, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t addr)
{
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	struct ibv_send_wr wr = {
		.wr_id = 2,
		.opcode = IBV_WR_BIND_MW,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = WINDOW;
	wr.bind_mw.bind_info.mw_access_flags = WINDOW_ACCESS;
	CHECK(ibv_post_send(b->qp, &wr, &bad) == 0, "post IBV_WR_BIND_MW");
	expect_success(b->cq, IBV_WC_BIND_MW, "type-2 bind (IBV_WR_BIND_MW)");
	mw->rkey = rkey;
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();
	struct ibv_device_attr dev;
	CHECK(ibv_query_device(ctx, &dev) == 0, "query device");
	CHECK(dev.device_cap_flags & IBV_DEVICE_MEM_WINDOW,
	      "the device reports no memory windows (over vrdma: vrdma-backend "
	      "--allow-memory-windows)");
	CHECK(dev.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B, "no type-2B windows");
	CHECK(dev.max_mw > 0, "max_mw is 0");
	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, PORT, &port) == 0, "query port");
	mtu = port.active_mtu;
	CHECK(ibv_query_gid(ctx, PORT, 0, &gid) == 0, "query GID 0");

	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc PD");
	struct side a = { .cq = ibv_create_cq(ctx, 16, NULL, NULL, 0) };
	struct side b = { .cq = ibv_create_cq(ctx, 16, NULL, NULL, 0) };
	CHECK(a.cq && b.cq, "create CQs");
	open_pair(&a, &b);

	/* B's memory, two windows' worth, bindable; A's source and destination buffers. */
	unsigned char *target = aligned_alloc(4096, 2 * WINDOW);
	unsigned char *src = aligned_alloc(4096, WINDOW);
	unsigned char *dst = aligned_alloc(4096, WINDOW);
	unsigned char *recv_buf = aligned_alloc(4096, WINDOW);
	CHECK(target && src && dst && recv_buf, "buffers");
	memset(target, 0, 2 * WINDOW);
	struct ibv_mr *target_mr = ibv_reg_mr(pd, target, 2 * WINDOW,
					      IBV_ACCESS_LOCAL_WRITE | WINDOW_ACCESS |
						      IBV_ACCESS_MW_BIND);
	CHECK(target_mr, "register the target with IBV_ACCESS_MW_BIND");
	struct ibv_mr *src_mr = ibv_reg_mr(pd, src, WINDOW, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dst_mr = ibv_reg_mr(pd, dst, WINDOW, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *recv_mr = ibv_reg_mr(pd, recv_buf, WINDOW, IBV_ACCESS_LOCAL_WRITE);
	CHECK(src_mr && dst_mr && recv_mr, "register A's buffers");
	uint64_t base = (uintptr_t)target;

	/* Type 1: bound with ibv_bind_mw on B, then bound again read-only. */
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw1, "ibv_alloc_mw type 1");
	bind_type1(&b, mw1, target_mr, base, WINDOW_ACCESS);
	write_and_read(&a, src_mr, dst_mr, target, 0, base, mw1->rkey, 1, "type-1 window");
	bind_type1(&b, mw1, target_mr, base, IBV_ACCESS_REMOTE_READ);
	read_back(&a, dst_mr, target, base, mw1->rkey, "type-1 window, read-only: RDMA READ");
	expect_access_error(&a, src_mr, base, mw1->rkey, "type-1 window, read-only: RDMA WRITE");
	replace_pair(&a, &b);

	/* Type 2: bound by a work request on B, invalidated by B's LOCAL_INV. */
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw2, "ibv_alloc_mw type 2");
	bind_type2(&b, mw2, target_mr, base + WINDOW);
	write_and_read(&a, src_mr, dst_mr, target, WINDOW, base + WINDOW, mw2->rkey, 2,
		       "type-2 window");
	struct ibv_send_wr inv = {
		.wr_id = 4,
		.opcode = IBV_WR_LOCAL_INV,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad_send;
	inv.invalidate_rkey = mw2->rkey;
	CHECK(ibv_post_send(b.qp, &inv, &bad_send) == 0, "post IBV_WR_LOCAL_INV");
	expect_success(b.cq, IBV_WC_LOCAL_INV, "LOCAL_INV of the type-2 window");
	expect_access_error(&a, src_mr, base + WINDOW, mw2->rkey,
			    "type-2 window after LOCAL_INV");
	replace_pair(&a, &b);

	/* Bound again, then invalidated remotely by A's SEND_WITH_INV. */
	bind_type2(&b, mw2, target_mr, base + WINDOW);
	write_and_read(&a, src_mr, dst_mr, target, WINDOW, base + WINDOW, mw2->rkey, 3,
		       "type-2 window, bound again");
	struct ibv_sge rsge = { .addr = (uintptr_t)recv_buf, .length = WINDOW,
				.lkey = recv_mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 5, .sg_list = &rsge, .num_sge = 1 }, *bad_recv;
	CHECK(ibv_post_recv(b.qp, &rwr, &bad_recv) == 0, "post receive on B");
	fill(src, MSG, 4);
	struct ibv_sge ssge = { .addr = (uintptr_t)src, .length = MSG, .lkey = src_mr->lkey };
	struct ibv_send_wr send = {
		.wr_id = 6,
		.sg_list = &ssge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_INV,
		.send_flags = IBV_SEND_SIGNALED,
	};
	send.invalidate_rkey = mw2->rkey;
	CHECK(ibv_post_send(a.qp, &send, &bad_send) == 0, "post IBV_WR_SEND_WITH_INV");
	expect_success(a.cq, IBV_WC_SEND, "SEND_WITH_INV");
	struct ibv_wc wc = poll_one(b.cq, "receive of the SEND_WITH_INV");
	CHECK(wc.status == IBV_WC_SUCCESS, "receive: status %s", ibv_wc_status_str(wc.status));
	CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == MSG, "receive: opcode %d, %u bytes",
	      wc.opcode, wc.byte_len);
	/* vrdma reports IBV_WC_WITH_INV; rdma-core's rxe provider hands the kernel's
	 * IB_WC_WITH_INVALIDATE over unchanged, which is ibverbs' IBV_WC_IP_CSUM_OK bit. */
	CHECK(wc.wc_flags & (IBV_WC_WITH_INV | IBV_WC_IP_CSUM_OK),
	      "receive: wc_flags %#x without the invalidation", wc.wc_flags);
	CHECK(wc.invalidated_rkey == mw2->rkey, "receive: invalidated rkey %#x, expected %#x",
	      wc.invalidated_rkey, mw2->rkey);
	printf("receive: invalidated rkey %#x (wc_flags %#x)\n", wc.invalidated_rkey,
	       wc.wc_flags);
	expect_same(recv_buf, src, MSG, "SEND_WITH_INV payload");
	expect_access_error(&a, src_mr, base + WINDOW, mw2->rkey,
			    "type-2 window after SEND_WITH_INV");
	replace_pair(&a, &b);

	/* The type-1 window is still bound: the invalidations were the type-2 window's. */
	read_back(&a, dst_mr, target, base, mw1->rkey, "type-1 window, still bound: RDMA READ");

	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "dealloc windows");
	CHECK(ibv_dereg_mr(target_mr) == 0 && ibv_dereg_mr(src_mr) == 0 &&
		      ibv_dereg_mr(dst_mr) == 0 && ibv_dereg_mr(recv_mr) == 0,
	      "deregister");
	CHECK(ibv_destroy_qp(a.qp) == 0 && ibv_destroy_qp(b.qp) == 0, "destroy QPs");
	CHECK(ibv_destroy_cq(a.cq) == 0 && ibv_destroy_cq(b.cq) == 0, "destroy CQs");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc PD");
	CHECK(ibv_close_device(ctx) == 0, "close");
	free(target);
	free(src);
	free(dst);
	free(recv_buf);
	printf("memory windows: all passed\n");
	return 0;
}
