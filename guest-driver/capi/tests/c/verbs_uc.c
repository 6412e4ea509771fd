/* UC queue pairs: two UC QPs of one process over port 1 of the first verbs device, connected
 * with UC's attribute masks (no RC-only attribute accepted), then SEND, SEND_WITH_IMM,
 * RDMA_WRITE and RDMA_WRITE_WITH_IMM of multi-packet messages, every byte verified, and an
 * RDMA READ that must not succeed on UC. Plain rdma-core API: runs against rdma-core's
 * libibverbs (e.g. on rxe0) and, unchanged, against vrdma's drop-in libibverbs.so.1.
 * Exit status 0 = pass; the last line is "UC: PASS".
 *
 * Build: cc -O2 -Wall -o verbs_uc verbs_uc.c -libverbs */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "verbs_test.h"

#define BUF_SIZE (128 * 1024)
/* Several packets at any path MTU up to 4096: UC's FIRST/MIDDLE/LAST packets are exercised. */
#define MSG_SIZE 10000
#define SEND_IMM 0x5eadbeefu
#define WRITE_IMM 0x0badcafeu

struct end {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	unsigned char *buf;
};

static void expect_untouched(const unsigned char *p, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		CHECK(p[i] == 0, "%s: byte %zu was written (%u)", what, i, p[i]);
}

/* Waits up to HANG_BOUND_S for one completion, whatever its status. */
static struct ibv_wc wait_any(struct end *e)
{
	struct ibv_wc wc;
	time_t deadline = time(NULL) + HANG_BOUND_S;
	for (;;) {
		int n = ibv_poll_cq(e->cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq returned %d", n);
		if (n == 1)
			return wc;
		CHECK(time(NULL) < deadline, "no completion within %d s", HANG_BOUND_S);
	}
}

static struct ibv_wc wait_ok(struct end *e)
{
	struct ibv_wc wc = wait_any(e);
	CHECK(wc.status == IBV_WC_SUCCESS, "completion of wr %" PRIu64 ": %s", wc.wr_id,
	      ibv_wc_status_str(wc.status));
	return wc;
}

static void setup(struct ibv_context *ctx, struct ibv_pd *pd, struct end *e)
{
	CHECK(posix_memalign((void **)&e->buf, 64, BUF_SIZE) == 0, "posix_memalign");
	memset(e->buf, 0, BUF_SIZE);
	/* No remote read: nothing may be read from a UC peer anyway. */
	e->mr = ibv_reg_mr(pd, e->buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(e->mr, "ibv_reg_mr");
	e->cq = ibv_create_cq(ctx, 64, e, NULL, 0);
	CHECK(e->cq, "ibv_create_cq");
	struct ibv_qp_init_attr init = {
		.send_cq = e->cq,
		.recv_cq = e->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2,
			 .max_recv_sge = 2 },
		.qp_type = IBV_QPT_UC,
	};
	e->qp = ibv_create_qp(pd, &init);
	CHECK(e->qp, "ibv_create_qp(IBV_QPT_UC)");
	CHECK(e->qp->qp_type == IBV_QPT_UC, "qp_type %d", e->qp->qp_type);
	CHECK(init.cap.max_send_wr >= 16 && init.cap.max_recv_wr >= 16, "caps not written back");
}

static void teardown(struct end *e)
{
	CHECK(ibv_destroy_qp(e->qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(e->cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_dereg_mr(e->mr) == 0, "ibv_dereg_mr");
	free(e->buf);
}

/* RESET -> INIT -> RTR -> RTS with exactly UC's masks, after checking that each RC-only
 * attribute is refused with EINVAL (the kernel's ib_modify_qp_is_ok table). */
static void connect_uc(struct ibv_qp *qp, uint32_t remote_qpn, uint32_t sq_psn,
		       uint32_t rq_psn, const union ibv_gid *gid, enum ibv_mtu mtu)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = PORT,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	};
	int init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	CHECK(ibv_modify_qp(qp, &a, init_mask | IBV_QP_QKEY) == EINVAL,
	      "INIT with a Q_Key must be EINVAL on UC");
	errno = ibv_modify_qp(qp, &a, init_mask);
	CHECK(errno == 0, "modify to INIT");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = remote_qpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = 0;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = PORT;
	int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	CHECK(ibv_modify_qp(qp, &a, rtr_mask | IBV_QP_MAX_DEST_RD_ATOMIC) == EINVAL,
	      "RTR with max_dest_rd_atomic must be EINVAL on UC");
	CHECK(ibv_modify_qp(qp, &a, rtr_mask | IBV_QP_MIN_RNR_TIMER) == EINVAL,
	      "RTR with min_rnr_timer must be EINVAL on UC");
	errno = ibv_modify_qp(qp, &a, rtr_mask);
	CHECK(errno == 0, "modify to RTR");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	int rc_only[] = { IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY,
			  IBV_QP_MAX_QP_RD_ATOMIC };
	for (size_t i = 0; i < sizeof(rc_only) / sizeof(rc_only[0]); i++)
		CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | rc_only[i]) == EINVAL,
		      "RTS with RC-only attribute %#x must be EINVAL on UC", rc_only[i]);
	errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	CHECK(errno == 0, "modify to RTS");
	CHECK(qp->state == IBV_QPS_RTS, "qp->state not updated");
}

static void post_recv_at(struct end *e, size_t offset, uint32_t length, uint64_t wr_id)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)e->buf + offset, .length = length, .lkey = e->mr->lkey
	};
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = length ? 1 : 0 },
			   *bad = NULL;
	errno = ibv_post_recv(e->qp, &wr, &bad);
	CHECK(errno == 0, "ibv_post_recv");
}

/* Posts MSG_SIZE bytes from `offset` of e's buffer, split over two SGEs. */
static int post_msg(struct end *e, enum ibv_wr_opcode op, size_t offset, uint64_t remote_addr,
		    uint32_t rkey, uint32_t imm_host, uint64_t wr_id)
{
	struct ibv_sge sge[2] = {
		{ .addr = (uintptr_t)e->buf + offset, .length = 3000, .lkey = e->mr->lkey },
		{ .addr = (uintptr_t)e->buf + offset + 3000, .length = MSG_SIZE - 3000,
		  .lkey = e->mr->lkey },
	};
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = sge, .num_sge = 2, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(imm_host),
	}, *bad = NULL;
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = rkey;
	int ret = ibv_post_send(e->qp, &wr, &bad);
	CHECK(ret == 0 || bad == &wr, "ibv_post_send failed (%d) without naming the request", ret);
	return ret;
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();

	struct ibv_port_attr pattr;
	CHECK(ibv_query_port(ctx, PORT, &pattr) == 0, "ibv_query_port");
	CHECK(pattr.state == IBV_PORT_ACTIVE, "port not active");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, PORT, 0, &gid) == 0, "ibv_query_gid");
	enum ibv_mtu mtu = pattr.active_mtu < IBV_MTU_1024 ? pattr.active_mtu : IBV_MTU_1024;

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	struct end a = { 0 }, b = { 0 };
	setup(ctx, pd, &a);
	setup(ctx, pd, &b);
	connect_uc(a.qp, b.qp->qp_num, 0x100, 0x200, &gid, mtu);
	connect_uc(b.qp, a.qp->qp_num, 0x200, 0x100, &gid, mtu);

	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	CHECK(ibv_query_qp(a.qp, &qattr, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_SQ_PSN,
			   &qinit) == 0,
	      "ibv_query_qp");
	CHECK(qattr.qp_state == IBV_QPS_RTS && qattr.dest_qp_num == b.qp->qp_num &&
		      qinit.qp_type == IBV_QPT_UC,
	      "ibv_query_qp: state %d dest %u type %d", qattr.qp_state, qattr.dest_qp_num,
	      qinit.qp_type);

	/* UC drops what arrives with no receive posted: every receive goes first. */

	/* SEND: a[0, MSG) into b at 16384. */
	fill(a.buf, MSG_SIZE, 1);
	post_recv_at(&b, 16384, MSG_SIZE + 100, 10);
	CHECK(post_msg(&a, IBV_WR_SEND, 0, 0, 0, 0, 1) == 0, "post SEND");
	struct ibv_wc wc = wait_ok(&a);
	CHECK(wc.wr_id == 1 && wc.opcode == IBV_WC_SEND, "SEND completion");
	wc = wait_ok(&b);
	CHECK(wc.wr_id == 10 && wc.opcode == IBV_WC_RECV && wc.byte_len == MSG_SIZE &&
		      wc.qp_num == b.qp->qp_num && !(wc.wc_flags & IBV_WC_WITH_IMM),
	      "SEND receive: wr %" PRIu64 " opcode %d len %u qp %u flags %#x", wc.wr_id,
	      wc.opcode, wc.byte_len, wc.qp_num, wc.wc_flags);
	expect_same(b.buf + 16384, a.buf, MSG_SIZE, "UC SEND");

	/* SEND_WITH_IMM: a[16384, +MSG) into b at 32768. */
	fill(a.buf + 16384, MSG_SIZE, 2);
	post_recv_at(&b, 32768, MSG_SIZE, 11);
	CHECK(post_msg(&a, IBV_WR_SEND_WITH_IMM, 16384, 0, 0, SEND_IMM, 2) == 0,
	      "post SEND_WITH_IMM");
	wc = wait_ok(&a);
	CHECK(wc.wr_id == 2 && wc.opcode == IBV_WC_SEND, "SEND_WITH_IMM completion");
	wc = wait_ok(&b);
	CHECK(wc.wr_id == 11 && wc.opcode == IBV_WC_RECV && wc.byte_len == MSG_SIZE &&
		      (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == SEND_IMM,
	      "SEND_WITH_IMM receive: wr %" PRIu64 " opcode %d len %u flags %#x imm %#x",
	      wc.wr_id, wc.opcode, wc.byte_len, wc.wc_flags, ntohl(wc.imm_data));
	expect_same(b.buf + 32768, a.buf + 16384, MSG_SIZE, "UC SEND_WITH_IMM");

	/* RDMA_WRITE: a[32768, +MSG) to b at 49152; nothing completes at b. */
	fill(a.buf + 32768, MSG_SIZE, 3);
	CHECK(post_msg(&a, IBV_WR_RDMA_WRITE, 32768, (uintptr_t)b.buf + 49152, b.mr->rkey, 0,
		       3) == 0,
	      "post RDMA_WRITE");
	wc = wait_ok(&a);
	CHECK(wc.wr_id == 3 && wc.opcode == IBV_WC_RDMA_WRITE, "RDMA_WRITE completion");
	/* UC has no acknowledgements: the sender's completion says the message left, not that it
	 * was placed. The WRITE_WITH_IMM below, on the same QP, is placed after it: its receive
	 * completion is when this data can be checked. */

	/* RDMA_WRITE_WITH_IMM: a[49152, +MSG) to b at 65536, consuming a (buffer-less) receive. */
	fill(a.buf + 49152, MSG_SIZE, 4);
	post_recv_at(&b, 0, 0, 12);
	CHECK(post_msg(&a, IBV_WR_RDMA_WRITE_WITH_IMM, 49152, (uintptr_t)b.buf + 65536,
		       b.mr->rkey, WRITE_IMM, 4) == 0,
	      "post RDMA_WRITE_WITH_IMM");
	wc = wait_ok(&a);
	CHECK(wc.wr_id == 4 && wc.opcode == IBV_WC_RDMA_WRITE, "RDMA_WRITE_WITH_IMM completion");
	wc = wait_ok(&b);
	CHECK(wc.wr_id == 12 && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		      wc.byte_len == MSG_SIZE && (wc.wc_flags & IBV_WC_WITH_IMM) &&
		      ntohl(wc.imm_data) == WRITE_IMM,
	      "RDMA_WRITE_WITH_IMM receive: wr %" PRIu64 " opcode %d len %u flags %#x imm %#x",
	      wc.wr_id, wc.opcode, wc.byte_len, wc.wc_flags, ntohl(wc.imm_data));
	expect_same(b.buf + 49152, a.buf + 32768, MSG_SIZE, "UC RDMA_WRITE");
	expect_same(b.buf + 65536, a.buf + 49152, MSG_SIZE, "UC RDMA_WRITE_WITH_IMM");

	/* RDMA_READ does not exist on UC: vrdma refuses the post (EINVAL); native rxe accepts it
	 * and completes it in error. Either way nothing is read. Last: it may break the QP. */
	fill(b.buf + 81920, MSG_SIZE, 5);
	int ret = post_msg(&a, IBV_WR_RDMA_READ, 98304, (uintptr_t)b.buf + 81920, b.mr->rkey, 0,
			   5);
	if (ret) {
		CHECK(ret == EINVAL, "RDMA_READ on UC refused with %d, expected EINVAL", ret);
		printf("UC RDMA_READ: post refused with EINVAL\n");
	} else {
		wc = wait_any(&a);
		CHECK(wc.wr_id == 5 && wc.status != IBV_WC_SUCCESS,
		      "RDMA_READ on UC completed with %s", ibv_wc_status_str(wc.status));
		printf("UC RDMA_READ: completed with %s\n", ibv_wc_status_str(wc.status));
	}
	expect_untouched(a.buf + 98304, MSG_SIZE, "UC RDMA_READ target");

	teardown(&a);
	teardown(&b);
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("UC: PASS\n");
	return 0;
}
