/* Memory registration beyond ibv_reg_mr, on port 1 of the first verbs device, between two RC QPs
 * of one process, every byte verified; plain rdma-core API (runs natively on rxe0 and, unchanged,
 * over vrdma's drop-in):
 *   - ibv_reg_mr_iova with an iova far from the buffer's address (same offset within a page, as
 *     rxe needs): a peer's RDMA WRITE and READ and a local receive all address it by iova;
 *   - ibv_rereg_mr IBV_REREG_MR_CHANGE_ACCESS: remote write allowed afterwards;
 *   - IBV_REREG_MR_CHANGE_TRANSLATION: onto another buffer, used by a peer's WRITE (Linux rxe
 *     refuses this natively; the program then says so);
 *   - IBV_REREG_MR_CHANGE_PD: a QP of the old PD can no longer reach the region remotely.
 * A device without ibv_rereg_mr (rdma-core's rxe provider) passes with the first part only.
 * Exit status 0 = pass. */
#define _GNU_SOURCE

#include "verbs_test.h"

#define BUF_SIZE (64 * 1024)
#define MSG 4096
/* An iova far from any user address, with the buffer's offset within the page added. */
#define IOVA_BASE 0x100000000000ULL

struct side {
	struct ibv_qp *qp;
	unsigned char *buf;
	struct ibv_mr *mr;
};

static struct ibv_cq *cq;

static unsigned char *buffer(void)
{
	unsigned char *p;
	CHECK(posix_memalign((void **)&p, 4096, BUF_SIZE) == 0, "posix_memalign");
	memset(p, 0, BUF_SIZE);
	return p;
}

static void post(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t local, uint32_t lkey,
		 uint64_t remote, uint32_t rkey, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = local, .length = MSG, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad = NULL;
	errno = ibv_post_send(qp, &wr, &bad);
	CHECK(errno == 0, "ibv_post_send");
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_context *ctx = open_first_device();
	union ibv_gid gid;
	struct ibv_port_attr port;
	CHECK(ibv_query_gid(ctx, PORT, 0, &gid) == 0, "ibv_query_gid");
	CHECK(ibv_query_port(ctx, PORT, &port) == 0, "ibv_query_port");
	struct ibv_pd *pd = ibv_alloc_pd(ctx), *other_pd = ibv_alloc_pd(ctx);
	CHECK(pd && other_pd, "ibv_alloc_pd");
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq, "ibv_create_cq");
	struct side a = { .buf = buffer() }, b = { .buf = buffer() };
	struct side *sides[] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr init = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		sides[i]->qp = ibv_create_qp(pd, &init);
		CHECK(sides[i]->qp, "ibv_create_qp");
	}
	connect_qp(a.qp, b.qp->qp_num, &gid, port.active_mtu);
	connect_qp(b.qp, a.qp->qp_num, &gid, port.active_mtu);
	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	a.mr = ibv_reg_mr(pd, a.buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(a.mr, "ibv_reg_mr");

	/* b's buffer registered at an iova of its own. */
	uint64_t iova = IOVA_BASE + ((uintptr_t)b.buf & 4095);
	b.mr = ibv_reg_mr_iova(pd, b.buf, BUF_SIZE, iova, all);
	CHECK(b.mr, "ibv_reg_mr_iova");
	CHECK(b.mr->addr == b.buf, "mr->addr is the buffer, not the iova");
	fill(a.buf, MSG, 1);
	post(a.qp, IBV_WR_RDMA_WRITE, (uintptr_t)a.buf, a.mr->lkey, iova + 8192, b.mr->rkey, 1);
	wait_status(cq, IBV_WC_SUCCESS);
	expect_same(b.buf + 8192, a.buf, MSG, "WRITE to an iova");
	post(a.qp, IBV_WR_RDMA_READ, (uintptr_t)a.buf + 16384, a.mr->lkey, iova + 8192,
	     b.mr->rkey, 2);
	wait_status(cq, IBV_WC_SUCCESS);
	expect_same(a.buf + 16384, b.buf + 8192, MSG, "READ from an iova");
	/* A receive whose SGE is in iova space. */
	struct ibv_sge rsge = { .addr = iova + 24576, .length = MSG, .lkey = b.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 3, .sg_list = &rsge, .num_sge = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0, "ibv_post_recv");
	fill(a.buf + 32768, MSG, 3);
	post(a.qp, IBV_WR_SEND, (uintptr_t)a.buf + 32768, a.mr->lkey, 0, 0, 4);
	wait_status(cq, IBV_WC_SUCCESS);
	wait_status(cq, IBV_WC_SUCCESS);
	expect_same(b.buf + 24576, a.buf + 32768, MSG, "SEND into an iova SGE");
	printf("reg_mr_iova: WRITE, READ and receive by iova verified\n");

	/* a's region gains remote write. rdma-core's own rxe provider has no rereg at all: natively
	 * the program ends here, saying so. */
	errno = 0;
	int rc = ibv_rereg_mr(a.mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, all);
	if (rc == IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP) {
		printf("rereg: not supported by this device\n");
		printf("mr_rereg: all passed\n");
		return 0;
	}
	CHECK(rc == 0, "ibv_rereg_mr CHANGE_ACCESS returned %d", rc);
	fill(b.buf, MSG, 5);
	/* b's region is addressed by its iova, locally too. */
	post(b.qp, IBV_WR_RDMA_WRITE, iova, b.mr->lkey, (uintptr_t)a.buf + 40960, a.mr->rkey, 5);
	wait_status(cq, IBV_WC_SUCCESS);
	expect_same(a.buf + 40960, b.buf, MSG, "WRITE after a remote-write access change");
	printf("rereg access: verified\n");

	/* a's region moves to another buffer. */
	unsigned char *moved = buffer();
	errno = 0;
	rc = ibv_rereg_mr(a.mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, moved, BUF_SIZE, 0);
	if (rc == 0) {
		CHECK(a.mr->addr == moved && a.mr->length == BUF_SIZE, "mr fields not updated");
		fill(b.buf + 4096, MSG, 6);
		post(b.qp, IBV_WR_RDMA_WRITE, iova + 4096, b.mr->lkey, (uintptr_t)moved + 12288,
		     a.mr->rkey, 6);
		wait_status(cq, IBV_WC_SUCCESS);
		expect_same(moved + 12288, b.buf + 4096, MSG, "WRITE after a translation change");
		printf("rereg translation: verified\n");
	} else {
		CHECK(rc == IBV_REREG_MR_ERR_CMD, "ibv_rereg_mr CHANGE_TRANSLATION returned %d", rc);
		printf("rereg translation: not supported by this device (%s)\n", strerror(errno));
	}

	/* a's region moves to another PD: a's QP (of the first PD) no longer reaches it. */
	rc = ibv_rereg_mr(a.mr, IBV_REREG_MR_CHANGE_PD, other_pd, NULL, 0, 0);
	CHECK(rc == 0, "ibv_rereg_mr CHANGE_PD returned %d", rc);
	CHECK(a.mr->pd == other_pd, "mr->pd not updated");
	post(b.qp, IBV_WR_RDMA_WRITE, iova, b.mr->lkey, (uintptr_t)a.mr->addr, a.mr->rkey, 7);
	wait_status(cq, IBV_WC_REM_ACCESS_ERR);
	printf("rereg PD: remote access through a QP of the old PD refused\n");

	CHECK(ibv_destroy_qp(a.qp) == 0 && ibv_destroy_qp(b.qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_dereg_mr(a.mr) == 0 && ibv_dereg_mr(b.mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_dealloc_pd(other_pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("mr_rereg: all passed\n");
	return 0;
}
