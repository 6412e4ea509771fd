/* SEND, RDMA WRITE and RDMA READ between two RC QPs of one process over port 1 of the first
 * verbs device, SENDs into a shared receive queue resized with receives posted (when the
 * device has SRQs), and a UD request answered through ibv_create_ah_from_wc, all with data
 * verification. Plain rdma-core API: runs against rdma-core's libibverbs (e.g. on rxe0) and,
 * unchanged, against vrdma's drop-in libibverbs.so.1.
 * Buffers come from posix_memalign, as applications allocate them. Exit status 0 = pass. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "verbs_test.h"

#define BUF_SIZE (64 * 1024)
#define MSG_SIZE 4096
#define UD_QKEY 0x11111111
#define UD_MSG 512
/* What a UD receive buffer holds in front of the payload. */
#define GRH_SIZE ((int)sizeof(struct ibv_grh))

struct end {
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	unsigned char *buf;
};

/* Waits for one completion, by polling (use_events = 0) or through the completion channel. */
static struct ibv_wc wait_wc(struct end *e, int use_events)
{
	struct ibv_wc wc;
	time_t deadline = time(NULL) + HANG_BOUND_S;
	for (;;) {
		int n = ibv_poll_cq(e->cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq returned %d", n);
		if (n == 1) {
			CHECK(wc.status == IBV_WC_SUCCESS, "completion of wr %" PRIu64 ": %s",
			      wc.wr_id, ibv_wc_status_str(wc.status));
			return wc;
		}
		CHECK(time(NULL) < deadline, "no completion within %d s", HANG_BOUND_S);
		if (use_events) {
			struct ibv_cq *ev_cq;
			void *ev_ctx;
			CHECK(ibv_req_notify_cq(e->cq, 0) == 0, "ibv_req_notify_cq");
			/* A completion may have arrived before arming: poll once more first. */
			n = ibv_poll_cq(e->cq, 1, &wc);
			CHECK(n >= 0, "ibv_poll_cq returned %d", n);
			if (n == 1) {
				CHECK(wc.status == IBV_WC_SUCCESS, "completion: %s",
				      ibv_wc_status_str(wc.status));
				return wc;
			}
			CHECK(ibv_get_cq_event(e->channel, &ev_cq, &ev_ctx) == 0, "ibv_get_cq_event");
			CHECK(ev_cq == e->cq && ev_ctx == e, "event for another CQ");
			ibv_ack_cq_events(ev_cq, 1);
		}
	}
}

/* Buffer, MR, completion channel, CQ and a QP of `type`, receiving through `srq` if not NULL. */
static void setup_qp(struct ibv_context *ctx, struct ibv_pd *pd, struct end *e,
		     enum ibv_qp_type type, struct ibv_srq *srq)
{
	CHECK(posix_memalign((void **)&e->buf, 64, BUF_SIZE) == 0, "posix_memalign");
	memset(e->buf, 0, BUF_SIZE);
	e->mr = ibv_reg_mr(pd, e->buf, BUF_SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(e->mr, "ibv_reg_mr");
	e->channel = ibv_create_comp_channel(ctx);
	CHECK(e->channel, "ibv_create_comp_channel");
	e->cq = ibv_create_cq(ctx, 64, e, e->channel, 0);
	CHECK(e->cq, "ibv_create_cq");
	struct ibv_qp_init_attr init = {
		.send_cq = e->cq,
		.recv_cq = e->cq,
		.srq = srq,
		.cap = { .max_send_wr = 16, .max_recv_wr = srq ? 0 : 16, .max_send_sge = 1,
			 .max_recv_sge = srq ? 0 : 1 },
		.qp_type = type,
	};
	e->qp = ibv_create_qp(pd, &init);
	CHECK(e->qp, "ibv_create_qp");
	CHECK(init.cap.max_send_wr >= 16, "caps not written back");
	CHECK(e->qp->srq == srq, "qp->srq not set");
}

static void setup(struct ibv_context *ctx, struct ibv_pd *pd, struct end *e)
{
	setup_qp(ctx, pd, e, IBV_QPT_RC, NULL);
}

static void teardown(struct end *e)
{
	CHECK(ibv_destroy_qp(e->qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(e->cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_destroy_comp_channel(e->channel) == 0, "ibv_destroy_comp_channel");
	CHECK(ibv_dereg_mr(e->mr) == 0, "ibv_dereg_mr");
	free(e->buf);
}

static void post_recv_at(struct ibv_qp *qp, struct ibv_srq *srq, struct end *e, size_t offset,
			 uint32_t length, uint64_t wr_id)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)e->buf + offset, .length = length, .lkey = e->mr->lkey
	};
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
	errno = srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad);
	CHECK(errno == 0, srq ? "ibv_post_srq_recv" : "ibv_post_recv");
}

static void post_one(struct end *e, enum ibv_wr_opcode op, size_t offset, uint64_t remote_addr,
		     uint32_t rkey, uint64_t wr_id)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)e->buf + offset, .length = MSG_SIZE, .lkey = e->mr->lkey
	};
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad = NULL;
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = rkey;
	errno = ibv_post_send(e->qp, &wr, &bad);
	CHECK(errno == 0, "ibv_post_send");
}

/* ibv_resize_cq while completions may be pending: each comes out once, in order. */
static void resize_with_pending(struct end *a, struct end *b)
{
	for (uint64_t i = 0; i < 3; i++)
		post_one(a, IBV_WR_RDMA_WRITE, 0, (uintptr_t)b->buf + 16384, b->mr->rkey, 10 + i);
	errno = ibv_resize_cq(a->cq, 200);
	CHECK(errno == 0, "ibv_resize_cq to 200");
	CHECK(a->cq->cqe >= 200, "cq->cqe is %d after a resize to 200", a->cq->cqe);
	for (uint64_t i = 0; i < 3; i++) {
		struct ibv_wc wc = wait_wc(a, 0);
		CHECK(wc.wr_id == 10 + i && wc.opcode == IBV_WC_RDMA_WRITE,
		      "completion %" PRIu64 " after the resize is wr %" PRIu64, i, wc.wr_id);
	}
	struct ibv_wc extra;
	CHECK(ibv_poll_cq(a->cq, 1, &extra) == 0, "a completion came out twice");
	errno = ibv_resize_cq(a->cq, 16);
	CHECK(errno == 0, "ibv_resize_cq to 16");
	CHECK(a->cq->cqe >= 16, "cq->cqe is %d after a resize to 16", a->cq->cqe);
	printf("CQ resize: 3 pending completions kept, cqe now %d\n", a->cq->cqe);
}

/* Two SENDs from an RC QP into the SRQ of its peer, in the order the receives were posted. */
static void srq_sends(struct ibv_context *ctx, struct ibv_pd *pd, const union ibv_gid *gid,
		      enum ibv_mtu mtu)
{
	struct ibv_srq_init_attr sinit = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sinit);
	CHECK(srq, "ibv_create_srq");
	CHECK(sinit.attr.max_wr >= 16 && sinit.attr.max_sge >= 1, "SRQ caps %u/%u",
	      sinit.attr.max_wr, sinit.attr.max_sge);
	struct ibv_srq_attr sattr = { .srq_limit = 1 };
	errno = ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT);
	CHECK(errno == 0, "ibv_modify_srq");
	memset(&sattr, 0, sizeof(sattr));
	errno = ibv_query_srq(srq, &sattr);
	CHECK(errno == 0, "ibv_query_srq");
	CHECK(sattr.max_wr >= 16 && sattr.srq_limit == 1, "ibv_query_srq: max_wr %u limit %u",
	      sattr.max_wr, sattr.srq_limit);

	struct end c = { 0 }, d = { 0 };
	setup(ctx, pd, &c);
	setup_qp(ctx, pd, &d, IBV_QPT_RC, srq);
	connect_qp(c.qp, d.qp->qp_num, gid, mtu);
	connect_qp(d.qp, c.qp->qp_num, gid, mtu);
	for (int i = 0; i < 4; i++)
		post_recv_at(NULL, srq, &d, 8192 + (size_t)i * MSG_SIZE, MSG_SIZE, 200 + i);
	/* Resizing keeps the posted receives, in order (the sends below consume them). */
	sattr = (struct ibv_srq_attr){ .max_wr = 64 };
	errno = ibv_modify_srq(srq, &sattr, IBV_SRQ_MAX_WR);
	CHECK(errno == 0, "ibv_modify_srq to 64 receives");
	memset(&sattr, 0, sizeof(sattr));
	CHECK(ibv_query_srq(srq, &sattr) == 0 && sattr.max_wr >= 64 && sattr.srq_limit == 1,
	      "after the resize: max_wr %u limit %u", sattr.max_wr, sattr.srq_limit);
	sattr = (struct ibv_srq_attr){ .max_wr = 3 };
	errno = ibv_modify_srq(srq, &sattr, IBV_SRQ_MAX_WR);
	CHECK(errno == EINVAL, "a resize below the 4 posted receives must be EINVAL, not %d", errno);
	sattr = (struct ibv_srq_attr){ .max_wr = 8 };
	errno = ibv_modify_srq(srq, &sattr, IBV_SRQ_MAX_WR);
	CHECK(errno == 0, "ibv_modify_srq to 8 receives");
	for (int i = 0; i < 2; i++) {
		fill(c.buf + (size_t)i * MSG_SIZE, MSG_SIZE, 10 + i);
		post_one(&c, IBV_WR_SEND, (size_t)i * MSG_SIZE, 0, 0, 20 + i);
		struct ibv_wc wc = wait_wc(&c, 0);
		CHECK(wc.wr_id == 20 + (uint64_t)i && wc.opcode == IBV_WC_SEND, "send completion");
		wc = wait_wc(&d, i);
		CHECK(wc.wr_id == 200 + (uint64_t)i && wc.opcode == IBV_WC_RECV &&
			      wc.byte_len == MSG_SIZE && wc.qp_num == d.qp->qp_num,
		      "SRQ receive: wr %" PRIu64 " opcode %d len %u qp %u", wc.wr_id, wc.opcode,
		      wc.byte_len, wc.qp_num);
		expect_same(d.buf + 8192 + (size_t)i * MSG_SIZE, c.buf + (size_t)i * MSG_SIZE,
			    MSG_SIZE, i ? "SRQ SEND 2" : "SRQ SEND 1");
	}
	CHECK(ibv_destroy_srq(srq) == EBUSY, "ibv_destroy_srq of an SRQ in use must be EBUSY");
	teardown(&c);
	teardown(&d);
	CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
	printf("SRQ: verified (resized twice with 4 receives posted)\n");
}

static void ud_to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = PORT, .qkey = UD_QKEY };
	errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	CHECK(errno == 0, "UD modify to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	errno = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	CHECK(errno == 0, "UD modify to RTR");
	a.qp_state = IBV_QPS_RTS;
	errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	CHECK(errno == 0, "UD modify to RTS");
}

static void ud_send(struct end *e, struct ibv_ah *ah, uint32_t qpn, size_t offset, uint64_t wr_id)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)e->buf + offset, .length = UD_MSG, .lkey = e->mr->lkey
	};
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad = NULL;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = UD_QKEY;
	errno = ibv_post_send(e->qp, &wr, &bad);
	CHECK(errno == 0, "ibv_post_send (UD)");
}

/* A UD request from `u` to `v`; `v` answers through an AH made from the receive completion. */
static void ud_reply_from_wc(struct ibv_context *ctx, struct ibv_pd *pd, const union ibv_gid *gid)
{
	struct end u = { 0 }, v = { 0 };
	setup_qp(ctx, pd, &u, IBV_QPT_UD, NULL);
	setup_qp(ctx, pd, &v, IBV_QPT_UD, NULL);
	ud_to_rts(u.qp);
	ud_to_rts(v.qp);
	/* Receive buffers: the network header, then the payload. */
	post_recv_at(u.qp, NULL, &u, 8192, GRH_SIZE + UD_MSG, 300);
	post_recv_at(v.qp, NULL, &v, 8192, GRH_SIZE + UD_MSG, 301);

	struct ibv_ah_attr to_v = {
		.is_global = 1,
		.grh = { .dgid = *gid, .sgid_index = 0, .hop_limit = 64 },
		.port_num = PORT,
	};
	struct ibv_ah *ah = ibv_create_ah(pd, &to_v);
	CHECK(ah, "ibv_create_ah");
	fill(u.buf, UD_MSG, 5);
	ud_send(&u, ah, v.qp->qp_num, 0, 30);
	struct ibv_wc wc = wait_wc(&u, 0);
	CHECK(wc.wr_id == 30 && wc.opcode == IBV_WC_SEND, "UD send completion");
	wc = wait_wc(&v, 0);
	CHECK(wc.wr_id == 301 && wc.opcode == IBV_WC_RECV &&
		      wc.byte_len == (uint32_t)(GRH_SIZE + UD_MSG) && wc.src_qp == u.qp->qp_num,
	      "UD receive: wr %" PRIu64 " opcode %d len %u from QP %u", wc.wr_id, wc.opcode,
	      wc.byte_len, wc.src_qp);
	CHECK(wc.wc_flags & IBV_WC_GRH, "UD receive without GRH");
	expect_same(v.buf + 8192 + GRH_SIZE, u.buf, UD_MSG, "UD request");

	struct ibv_grh *grh = (struct ibv_grh *)(v.buf + 8192);
	struct ibv_ah_attr back;
	CHECK(ibv_init_ah_from_wc(ctx, PORT, &wc, grh, &back) == 0, "ibv_init_ah_from_wc");
	/* The header's hop limit is the one the request was sent with (RoCE v2 over IPv6). */
	CHECK(back.is_global && back.port_num == PORT && back.grh.hop_limit == 64 &&
		      memcmp(&back.grh.dgid, gid, sizeof(*gid)) == 0,
	      "ibv_init_ah_from_wc: global %d port %d hop limit %d", back.is_global,
	      back.port_num, back.grh.hop_limit);
	union ibv_gid sgid;
	CHECK(ibv_query_gid(ctx, PORT, back.grh.sgid_index, &sgid) == 0 &&
		      memcmp(&sgid, gid, sizeof(sgid)) == 0,
	      "ibv_init_ah_from_wc: sgid index %d is not the GID the request went to",
	      back.grh.sgid_index);
	struct ibv_ah *reply = ibv_create_ah_from_wc(pd, &wc, grh, PORT);
	CHECK(reply, "ibv_create_ah_from_wc");
	fill(v.buf, UD_MSG, 6);
	ud_send(&v, reply, wc.src_qp, 0, 31);
	wc = wait_wc(&v, 0);
	CHECK(wc.wr_id == 31 && wc.opcode == IBV_WC_SEND, "UD reply send completion");
	wc = wait_wc(&u, 0);
	CHECK(wc.wr_id == 300 && wc.opcode == IBV_WC_RECV && wc.src_qp == v.qp->qp_num,
	      "UD reply receive: wr %" PRIu64 " from QP %u", wc.wr_id, wc.src_qp);
	expect_same(u.buf + 8192 + GRH_SIZE, v.buf, UD_MSG, "UD reply via ibv_create_ah_from_wc");

	CHECK(ibv_destroy_ah(reply) == 0, "ibv_destroy_ah");
	CHECK(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
	teardown(&u);
	teardown(&v);
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();

	struct ibv_device_attr dattr;
	CHECK(ibv_query_device(ctx, &dattr) == 0, "ibv_query_device");
	struct ibv_port_attr pattr;
	CHECK(ibv_query_port(ctx, PORT, &pattr) == 0, "ibv_query_port");
	CHECK(pattr.state == IBV_PORT_ACTIVE, "port not active");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, PORT, 0, &gid) == 0, "ibv_query_gid");
	printf("vendor %#x part %#x, port MTU %d, link layer %d\n", dattr.vendor_id,
	       dattr.vendor_part_id, pattr.active_mtu, pattr.link_layer);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	struct end a = { 0 }, b = { 0 };
	setup(ctx, pd, &a);
	setup(ctx, pd, &b);
	enum ibv_mtu mtu = pattr.active_mtu < IBV_MTU_1024 ? pattr.active_mtu : IBV_MTU_1024;
	connect_qp(a.qp, b.qp->qp_num, &gid, mtu);
	connect_qp(b.qp, a.qp->qp_num, &gid, mtu);

	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	CHECK(ibv_query_qp(a.qp, &qattr, IBV_QP_STATE | IBV_QP_DEST_QPN, &qinit) == 0,
	      "ibv_query_qp");
	CHECK(qattr.qp_state == IBV_QPS_RTS && qattr.dest_qp_num == b.qp->qp_num,
	      "ibv_query_qp: state %d dest %u", qattr.qp_state, qattr.dest_qp_num);

	/* SEND: a's bytes [0, 4096) into b's receive buffer at 8192; b waits with events. */
	fill(a.buf, MSG_SIZE, 1);
	struct ibv_sge rsge = {
		.addr = (uintptr_t)b.buf + 8192, .length = MSG_SIZE, .lkey = b.mr->lkey
	};
	struct ibv_recv_wr rwr = { .wr_id = 100, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	errno = ibv_post_recv(b.qp, &rwr, &rbad);
	CHECK(errno == 0, "ibv_post_recv");
	post_one(&a, IBV_WR_SEND, 0, 0, 0, 1);
	struct ibv_wc wc = wait_wc(&a, 0);
	CHECK(wc.wr_id == 1 && wc.opcode == IBV_WC_SEND, "send completion");
	wc = wait_wc(&b, 1);
	CHECK(wc.wr_id == 100 && wc.opcode == IBV_WC_RECV && wc.byte_len == MSG_SIZE,
	      "receive completion: wr %" PRIu64 " opcode %d len %u", wc.wr_id, wc.opcode,
	      wc.byte_len);
	CHECK(wc.qp_num == b.qp->qp_num, "receive completion on QP %u", wc.qp_num);
	expect_same(b.buf + 8192, a.buf, MSG_SIZE, "SEND");

	/* RDMA WRITE: a's bytes [4096, 8192) to b's buffer at 16384. */
	fill(a.buf + 4096, MSG_SIZE, 2);
	post_one(&a, IBV_WR_RDMA_WRITE, 4096, (uintptr_t)b.buf + 16384, b.mr->rkey, 2);
	wc = wait_wc(&a, 1);
	CHECK(wc.wr_id == 2 && wc.opcode == IBV_WC_RDMA_WRITE, "write completion");
	expect_same(b.buf + 16384, a.buf + 4096, MSG_SIZE, "RDMA WRITE");
	resize_with_pending(&a, &b);

	/* RDMA READ: b's bytes [32768, 36864) into a's buffer at 12288. */
	fill(b.buf + 32768, MSG_SIZE, 3);
	post_one(&a, IBV_WR_RDMA_READ, 12288, (uintptr_t)b.buf + 32768, b.mr->rkey, 3);
	wc = wait_wc(&a, 0);
	CHECK(wc.wr_id == 3 && wc.opcode == IBV_WC_RDMA_READ, "read completion");
	expect_same(a.buf + 12288, b.buf + 32768, MSG_SIZE, "RDMA READ");

	if (dattr.max_srq > 0)
		srq_sends(ctx, pd, &gid, mtu);
	else
		printf("SRQ: not offered by the device\n");
	ud_reply_from_wc(ctx, pd, &gid);

	CHECK(ibv_dealloc_pd(pd) == EBUSY, "ibv_dealloc_pd of a PD in use must be EBUSY");
	teardown(&a);
	teardown(&b);
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("PASS\n");
	return 0;
}
