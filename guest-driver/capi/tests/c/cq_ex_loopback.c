/* Extended CQs and the extended queries between two RC QPs of one process over port 1 of the
 * first verbs device: ibv_query_device_ex, ibv_query_port (the extended path), then one
 * ibv_cq_ex shared by both QPs: SEND with immediate, RDMA WRITE with immediate and a plain SEND,
 * polled through ibv_start_poll/ibv_next_poll/ibv_end_poll with every accessor checked and
 * every byte verified; an empty CQ answering ENOENT; a batch mixed with ibv_poll_cq on
 * ibv_cq_ex_to_cq; a completion event through a channel (ibv_req_notify_cq on the cast CQ);
 * ibv_destroy_cq. Plain rdma-core API: runs against rdma-core's libibverbs (e.g. on rxe0) and,
 * unchanged, against vrdma's drop-in libibverbs.so.1. Exit status 0 = pass. */
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

#define BUF_SIZE (64 * 1024)
#define SEND_LEN 3000
#define WRITE_LEN 5000
#define WRITE_AT 32768
#define IMM_SEND 0x12345678u
#define IMM_WRITE 0xcafef00du

/* One completion as the accessors read it. */
struct read_wc {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t vendor_err, byte_len, imm, qp_num, src_qp, slid;
	unsigned int flags;
	uint8_t sl, dlid_path_bits;
};

static void read_current(struct ibv_cq_ex *cq, struct read_wc *out)
{
	out->wr_id = cq->wr_id;
	out->status = cq->status;
	out->opcode = ibv_wc_read_opcode(cq);
	out->vendor_err = ibv_wc_read_vendor_err(cq);
	out->byte_len = ibv_wc_read_byte_len(cq);
	out->imm = ntohl(ibv_wc_read_imm_data(cq));
	out->qp_num = ibv_wc_read_qp_num(cq);
	out->src_qp = ibv_wc_read_src_qp(cq);
	out->flags = ibv_wc_read_wc_flags(cq);
	out->slid = ibv_wc_read_slid(cq);
	out->sl = ibv_wc_read_sl(cq);
	out->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
}

/* Polls until `want` completions were read (HANG_BOUND_S at most), in batches. */
static int poll_ex(struct ibv_cq_ex *cq, struct read_wc *out, int want)
{
	int got = 0;
	time_t deadline = time(NULL) + HANG_BOUND_S;
	while (got < want) {
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int rc = ibv_start_poll(cq, &attr);
		if (rc == ENOENT) {
			CHECK(time(NULL) < deadline, "only %d of %d completions", got, want);
			continue;
		}
		CHECK(rc == 0, "ibv_start_poll: %d", rc);
		do {
			CHECK(got < want, "more completions than work requests");
			read_current(cq, &out[got++]);
			rc = ibv_next_poll(cq);
		} while (rc == 0);
		CHECK(rc == ENOENT, "ibv_next_poll: %d", rc);
		ibv_end_poll(cq);
	}
	return got;
}

static const struct read_wc *find(const struct read_wc *wcs, int n, uint64_t wr_id)
{
	for (int i = 0; i < n; i++)
		if (wcs[i].wr_id == wr_id)
			return &wcs[i];
	CHECK(0, "no completion of wr_id %" PRIu64, wr_id);
	return NULL;
}

static void post_send(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode opcode,
		      struct ibv_sge *sge, uint32_t imm, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = sge, .num_sge = 1, .opcode = opcode,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(imm) };
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad;
	errno = ibv_post_send(qp, &wr, &bad);
	CHECK(errno == 0, "ibv_post_send %" PRIu64, wr_id);
}

static void post_recv(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sge)
{
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = sge, .num_sge = 1 }, *bad;
	errno = ibv_post_recv(qp, &wr, &bad);
	CHECK(errno == 0, "ibv_post_recv %" PRIu64, wr_id);
}

/* `with_imm` of expect(): no IBV_WC_WITH_IMM; the flag and the immediate value (receives); the
 * flag only (rxe's send completion of a *_WITH_IMM request carries the flag, not the value). */
enum { NO_IMM, IMM_VALUE, IMM_FLAG };

/* What a completion must read; RC receives report the sender as src_qp or 0 (rxe: 0). */
static void expect(const struct read_wc *wc, enum ibv_wc_opcode opcode, uint32_t qp_num,
		   uint32_t byte_len, int with_imm, uint32_t imm, uint32_t peer)
{
	CHECK(wc->status == IBV_WC_SUCCESS && wc->vendor_err == 0, "wr %" PRIu64 ": status %d",
	      wc->wr_id, wc->status);
	CHECK(wc->opcode == opcode, "wr %" PRIu64 ": opcode %d, expected %d", wc->wr_id,
	      wc->opcode, opcode);
	CHECK(wc->qp_num == qp_num, "wr %" PRIu64 ": qp_num %u", wc->wr_id, wc->qp_num);
	if (byte_len)
		CHECK(wc->byte_len == byte_len, "wr %" PRIu64 ": byte_len %u, expected %u",
		      wc->wr_id, wc->byte_len, byte_len);
	CHECK(!!(wc->flags & IBV_WC_WITH_IMM) == !!with_imm, "wr %" PRIu64 ": wc_flags %#x",
	      wc->wr_id, wc->flags);
	if (with_imm == IMM_VALUE)
		CHECK(wc->imm == imm, "wr %" PRIu64 ": imm %#x, expected %#x", wc->wr_id, wc->imm,
		      imm);
	if (opcode & IBV_WC_RECV)
		CHECK(wc->src_qp == peer || wc->src_qp == 0, "wr %" PRIu64 ": src_qp %u",
		      wc->wr_id, wc->src_qp);
	/* RoCE has no LIDs. */
	CHECK(wc->slid == 0 && wc->dlid_path_bits == 0 && wc->sl < 16,
	      "wr %" PRIu64 ": slid %u sl %u path bits %u", wc->wr_id, wc->slid, wc->sl,
	      wc->dlid_path_bits);
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();

	struct ibv_device_attr_ex dattr;
	CHECK(ibv_query_device_ex(ctx, NULL, &dattr) == 0, "ibv_query_device_ex");
	CHECK(dattr.orig_attr.phys_port_cnt >= 1 && dattr.phys_port_cnt_ex >= 1,
	      "ibv_query_device_ex: %u / %u ports", dattr.orig_attr.phys_port_cnt,
	      dattr.phys_port_cnt_ex);
	CHECK((uint32_t)dattr.device_cap_flags_ex == dattr.orig_attr.device_cap_flags,
	      "device_cap_flags_ex %#" PRIx64 " vs %#x", dattr.device_cap_flags_ex,
	      dattr.orig_attr.device_cap_flags);
	struct ibv_query_device_ex_input input = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &input, &dattr) == EINVAL, "input comp_mask accepted");
	printf("query_device_ex: max_cqe %d, device_cap_flags_ex %#" PRIx64 "\n",
	       dattr.orig_attr.max_cqe, dattr.device_cap_flags_ex);

	struct ibv_port_attr pattr;
	CHECK(ibv_query_port(ctx, PORT, &pattr) == 0, "ibv_query_port");
	CHECK(pattr.state == IBV_PORT_ACTIVE, "port %d is not active", PORT);
	printf("query_port: active_mtu %d, port_cap_flags2 %#x\n", pattr.active_mtu,
	       pattr.port_cap_flags2);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, PORT, 0, &gid) == 0, "ibv_query_gid");

	struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
	CHECK(channel, "ibv_create_comp_channel");
	uint64_t all = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
		       IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
		       IBV_WC_EX_WITH_DLID_PATH_BITS;
	struct ibv_cq_init_attr_ex cq_attr = { .cqe = 64, .channel = channel, .wc_flags = all };
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &cq_attr);
	CHECK(cq, "ibv_create_cq_ex");
	struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
	CHECK(ibv_start_poll(cq, &pa) == ENOENT, "an empty CQ must answer ENOENT");
	struct ibv_cq *classic = ibv_cq_ex_to_cq(cq);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	unsigned char *src, *dst;
	CHECK(posix_memalign((void **)&src, 4096, BUF_SIZE) == 0 &&
		      posix_memalign((void **)&dst, 4096, BUF_SIZE) == 0,
	      "posix_memalign");
	fill(src, BUF_SIZE, 7);
	memset(dst, 0, BUF_SIZE);
	struct ibv_mr *src_mr = ibv_reg_mr(pd, src, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dst_mr = ibv_reg_mr(pd, dst, BUF_SIZE,
					   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(src_mr && dst_mr, "ibv_reg_mr");

	struct ibv_qp_init_attr qinit = { .send_cq = classic, .recv_cq = classic,
					  .cap = { .max_send_wr = 16, .max_recv_wr = 16,
						   .max_send_sge = 1, .max_recv_sge = 1 },
					  .qp_type = IBV_QPT_RC };
	struct ibv_qp *a = ibv_create_qp(pd, &qinit), *b = ibv_create_qp(pd, &qinit);
	CHECK(a && b, "ibv_create_qp");
	connect_qp(a, b->qp_num, &gid, pattr.active_mtu);
	connect_qp(b, a->qp_num, &gid, pattr.active_mtu);

	/* SEND with immediate, RDMA WRITE with immediate, SEND: three receives consumed. */
	struct ibv_sge r0 = { (uintptr_t)dst, SEND_LEN, dst_mr->lkey };
	struct ibv_sge r1 = { (uintptr_t)dst + 4096, 16, dst_mr->lkey };
	struct ibv_sge r2 = { (uintptr_t)dst + 8192, SEND_LEN, dst_mr->lkey };
	post_recv(b, 10, &r0);
	post_recv(b, 11, &r1);
	post_recv(b, 12, &r2);
	struct ibv_sge s0 = { (uintptr_t)src, SEND_LEN, src_mr->lkey };
	struct ibv_sge s1 = { (uintptr_t)src + 4096, WRITE_LEN, src_mr->lkey };
	struct ibv_sge s2 = { (uintptr_t)src + 16384, SEND_LEN, src_mr->lkey };
	post_send(a, 1, IBV_WR_SEND_WITH_IMM, &s0, IMM_SEND, 0, 0);
	post_send(a, 2, IBV_WR_RDMA_WRITE_WITH_IMM, &s1, IMM_WRITE, (uintptr_t)dst + WRITE_AT,
		  dst_mr->rkey);
	post_send(a, 3, IBV_WR_SEND, &s2, 0, 0, 0);
	struct read_wc wcs[6];
	int n = poll_ex(cq, wcs, 6);
	expect(find(wcs, n, 1), IBV_WC_SEND, a->qp_num, 0, IMM_FLAG, 0, 0);
	expect(find(wcs, n, 2), IBV_WC_RDMA_WRITE, a->qp_num, 0, IMM_FLAG, 0, 0);
	expect(find(wcs, n, 3), IBV_WC_SEND, a->qp_num, 0, NO_IMM, 0, 0);
	expect(find(wcs, n, 10), IBV_WC_RECV, b->qp_num, SEND_LEN, IMM_VALUE, IMM_SEND, a->qp_num);
	expect(find(wcs, n, 11), IBV_WC_RECV_RDMA_WITH_IMM, b->qp_num, WRITE_LEN, IMM_VALUE, IMM_WRITE,
	       a->qp_num);
	expect(find(wcs, n, 12), IBV_WC_RECV, b->qp_num, SEND_LEN, NO_IMM, 0, a->qp_num);
	expect_same(dst, src, SEND_LEN, "SEND with immediate");
	expect_same(dst + WRITE_AT, src + 4096, WRITE_LEN, "RDMA WRITE with immediate");
	expect_same(dst + 8192, src + 16384, SEND_LEN, "SEND");
	CHECK(ibv_start_poll(cq, &pa) == ENOENT, "completions left over");

	/* A batch that reads one completion consumes exactly it; ibv_poll_cq gets the rest. */
	for (int i = 0; i < 3; i++)
		post_send(a, 100 + i, IBV_WR_RDMA_WRITE, &s0, 0, (uintptr_t)dst + 16384,
			  dst_mr->rkey);
	struct ibv_wc wc[4];
	int polled = 0;
	time_t deadline = time(NULL) + HANG_BOUND_S;
	while (polled < 3) {
		CHECK(time(NULL) < deadline, "only %d of 3 mixed completions", polled);
		if (polled == 0) {
			if (ibv_start_poll(cq, &pa) != 0)
				continue;
			CHECK(cq->wr_id == 100 && cq->status == IBV_WC_SUCCESS,
			      "first mixed completion: wr_id %" PRIu64, cq->wr_id);
			ibv_end_poll(cq);
			polled = 1;
			continue;
		}
		int got = ibv_poll_cq(classic, 4, wc);
		CHECK(got >= 0, "ibv_poll_cq");
		for (int i = 0; i < got; i++, polled++)
			CHECK(wc[i].wr_id == (uint64_t)(100 + polled) &&
				      wc[i].status == IBV_WC_SUCCESS,
			      "mixed completion %d: wr_id %" PRIu64, polled, wc[i].wr_id);
	}
	expect_same(dst + 16384, src, SEND_LEN, "RDMA WRITE");
	printf("mixed with ibv_poll_cq: verified\n");

	/* A completion event on the cast CQ, then the completion through a batch. */
	CHECK(ibv_req_notify_cq(classic, 0) == 0, "ibv_req_notify_cq");
	post_recv(b, 13, &r0);
	post_send(a, 4, IBV_WR_SEND, &s2, 0, 0, 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK(ibv_get_cq_event(channel, &ev_cq, &ev_ctx) == 0 && ev_cq == classic,
	      "ibv_get_cq_event");
	ibv_ack_cq_events(ev_cq, 1);
	n = poll_ex(cq, wcs, 2);
	expect(find(wcs, n, 4), IBV_WC_SEND, a->qp_num, 0, NO_IMM, 0, 0);
	expect(find(wcs, n, 13), IBV_WC_RECV, b->qp_num, SEND_LEN, NO_IMM, 0, a->qp_num);
	expect_same(dst, src + 16384, SEND_LEN, "SEND after a completion event");

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(classic) == 0, "ibv_destroy_cq");
	CHECK(ibv_destroy_comp_channel(channel) == 0, "ibv_destroy_comp_channel");
	CHECK(ibv_dereg_mr(src_mr) == 0 && ibv_dereg_mr(dst_mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("cq_ex: all passed\n");
	return 0;
}
