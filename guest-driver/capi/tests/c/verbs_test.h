/* Helpers shared by the C verbs test programs: plain rdma-core API only, so that every program
 * runs unchanged against rdma-core's libibverbs and against vrdma's drop-in. */
#ifndef VERBS_TEST_H
#define VERBS_TEST_H

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define PORT 1

/* How long a program waits for a completion or an event before it declares a hang: a bound for
 * a test that would otherwise never end, far beyond any completion time (milliseconds under
 * TCG), so that a loaded machine cannot fail a test by its speed. */
#define HANG_BOUND_S 120

#define CHECK(cond, ...)                                                                     \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                 \
			fprintf(stderr, __VA_ARGS__);                                        \
			fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));        \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

static inline void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed);
}

static inline void expect_same(const unsigned char *a, const unsigned char *b, size_t n,
			       const char *what)
{
	for (size_t i = 0; i < n; i++)
		CHECK(a[i] == b[i], "%s: byte %zu is %u, expected %u", what, i, a[i], b[i]);
	printf("%s: %zu bytes verified\n", what, n);
}

/* The remote access connect_qp grants; a program defines it before including this header to
 * grant more (atomics). */
#ifndef CONNECT_QP_ACCESS
#define CONNECT_QP_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#endif

/* Opens the first verbs device (rxe0 natively, vrdma0 over the drop-in) and prints its name,
 * which the dropin suite checks. */
static inline struct ibv_context *open_first_device(void)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num > 0, "no verbs device");
	printf("device: %s\n", ibv_get_device_name(list[0]));
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	ibv_free_device_list(list);
	return ctx;
}

/* The next completion of `cq`, which must have `status` and come within HANG_BOUND_S. */
static inline struct ibv_wc wait_status(struct ibv_cq *cq, enum ibv_wc_status status)
{
	struct ibv_wc wc;
	time_t deadline = time(NULL) + HANG_BOUND_S;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n == 1)
			break;
		CHECK(time(NULL) < deadline, "no completion within %d s", HANG_BOUND_S);
	}
	CHECK(wc.status == status, "wr %" PRIu64 ": %s, expected %s", wc.wr_id,
	      ibv_wc_status_str(wc.status), ibv_wc_status_str(status));
	return wc;
}

/* Moves an RC QP through INIT and RTR to RTS towards `remote_qpn` at `gid` (GID index 0). */
static inline void connect_qp(struct ibv_qp *qp, uint32_t remote_qpn, const union ibv_gid *gid,
				     enum ibv_mtu mtu)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = PORT,
		.qp_access_flags = CONNECT_QP_ACCESS,
	};
	errno = ibv_modify_qp(qp, &a,
			      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	CHECK(errno == 0, "modify to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = remote_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = 0;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = PORT;
	errno = ibv_modify_qp(qp, &a,
			      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				      IBV_QP_MIN_RNR_TIMER);
	CHECK(errno == 0, "modify to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	errno = ibv_modify_qp(qp, &a,
			      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	CHECK(errno == 0, "modify to RTS");
	CHECK(qp->state == IBV_QPS_RTS, "qp->state not updated");
}

#endif
