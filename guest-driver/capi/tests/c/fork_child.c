/* fork() with registered memory, on port 1 of the first verbs device; plain rdma-core API (runs
 * natively on rxe0 and, unchanged, over vrdma's drop-in). Without ibv_fork_init, as on a kernel
 * with copy-on-fork (ibv_is_fork_initialized says IBV_FORK_UNNEEDED there):
 *   - a child sees the parent's registered buffer as it was at fork() and its writes to it stay
 *     its own;
 *   - after the child has written and exited, the parent's region still works: a peer's RDMA
 *     WRITE into it lands in the parent's buffer, where the parent reads it.
 * Exit status 0 = pass. */
#define _GNU_SOURCE
#include <sys/wait.h>
#include <unistd.h>

#include "verbs_test.h"

#define BUF_SIZE (64 * 1024)
#define MSG 4096

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_context *ctx = open_first_device();
	union ibv_gid gid;
	struct ibv_port_attr port;
	CHECK(ibv_query_gid(ctx, PORT, 0, &gid) == 0, "ibv_query_gid");
	CHECK(ibv_query_port(ctx, PORT, &port) == 0, "ibv_query_port");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq, "ibv_create_cq");
	struct ibv_qp *qp[2];
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr init = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		qp[i] = ibv_create_qp(pd, &init);
		CHECK(qp[i], "ibv_create_qp");
	}
	connect_qp(qp[0], qp[1]->qp_num, &gid, port.active_mtu);
	connect_qp(qp[1], qp[0]->qp_num, &gid, port.active_mtu);

	unsigned char *target, *source;
	CHECK(posix_memalign((void **)&target, 4096, BUF_SIZE) == 0, "posix_memalign");
	CHECK(posix_memalign((void **)&source, 4096, BUF_SIZE) == 0, "posix_memalign");
	fill(target, BUF_SIZE, 7);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *target_mr = ibv_reg_mr(pd, target, BUF_SIZE, access);
	struct ibv_mr *source_mr = ibv_reg_mr(pd, source, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(target_mr && source_mr, "ibv_reg_mr");
	printf("fork status: %d\n", (int)ibv_is_fork_initialized());

	pid_t child = fork();
	CHECK(child >= 0, "fork");
	if (child == 0) {
		/* The child: the buffer as at fork(), then its own writes. Only plain memory
		 * operations here; the device is the parent's. */
		unsigned char expected[256];
		fill(expected, sizeof(expected), 7);
		if (memcmp(target, expected, sizeof(expected)) != 0)
			_exit(2);
		memset(target, 0xee, BUF_SIZE);
		_exit(0);
	}
	int status = 0;
	CHECK(waitpid(child, &status, 0) == child, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (status %#x)", status);
	for (size_t i = 0; i < BUF_SIZE; i++)
		CHECK(target[i] == (unsigned char)(i * 31 + 7), "the child's write reached byte %zu",
		      i);
	printf("child's writes stayed in the child\n");

	/* The parent's region after the fork: a WRITE into it arrives where the parent reads. */
	fill(source, MSG, 9);
	struct ibv_sge sge = { .addr = (uintptr_t)source, .length = MSG, .lkey = source_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uintptr_t)target + 8192;
	wr.wr.rdma.rkey = target_mr->rkey;
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(qp[0], &wr, &bad) == 0, "ibv_post_send");
	wait_status(cq, IBV_WC_SUCCESS);
	expect_same(target + 8192, source, MSG, "WRITE into the parent's region after fork");

	CHECK(ibv_destroy_qp(qp[0]) == 0 && ibv_destroy_qp(qp[1]) == 0, "ibv_destroy_qp");
	CHECK(ibv_dereg_mr(target_mr) == 0 && ibv_dereg_mr(source_mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("fork: all passed\n");
	return 0;
}
