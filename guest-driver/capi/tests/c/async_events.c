/* Asynchronous events through ibv_get_async_event / ibv_ack_async_event on port 1 of the first
 * verbs device, plain rdma-core API (runs natively on rxe0 and, unchanged, over vrdma's drop-in):
 *   async_events          SRQ_LIMIT_REACHED for an SRQ (made by ibv_create_srq_ex) drained
 *                         below its armed limit, then QP_LAST_WQE_REACHED for the QP attached
 *                         to it moved to ERR; async_fd is pollable, readable only while an
 *                         event is pending, and gives EAGAIN when non-blocking and empty; each
 *                         event names the application's object.
 *   async_events fatal    holds a QP, prints "ready", and waits for IBV_EVENT_DEVICE_FATAL (the
 *                         caller then takes the device away, e.g. kills vrdma's backend).
 * Exit status 0 = pass. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "verbs_test.h"

#define SRQ_WRS 32
#define POSTED 8
#define LIMIT 4
#define SENDS 5
#define MSG 256

struct setup {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	unsigned char *buf;
};

static void set_up(struct setup *s)
{
	s->ctx = open_first_device();
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd, "ibv_alloc_pd");
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	CHECK(s->cq, "ibv_create_cq");
	CHECK(posix_memalign((void **)&s->buf, 4096, 64 * 1024) == 0, "posix_memalign");
	memset(s->buf, 0, 64 * 1024);
	s->mr = ibv_reg_mr(s->pd, s->buf, 64 * 1024, IBV_ACCESS_LOCAL_WRITE);
	CHECK(s->mr, "ibv_reg_mr");
}

static struct ibv_qp *rc_qp(struct setup *s, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.srq = srq,
		.cap = { .max_send_wr = 16, .max_recv_wr = srq ? 0 : 16, .max_send_sge = 1,
			 .max_recv_sge = srq ? 0 : 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(s->pd, &init);
	CHECK(qp, "ibv_create_qp");
	return qp;
}

/* Whether async_fd becomes readable within `ms` milliseconds. */
static int async_readable(struct ibv_context *ctx, int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	int n = poll(&p, 1, ms);
	CHECK(n >= 0, "poll(async_fd)");
	return n == 1 && (p.revents & POLLIN);
}

/* The next event, which must come within HANG_BOUND_S (a bound for a hang). */
static struct ibv_async_event next_event(struct ibv_context *ctx)
{
	struct ibv_async_event ev;
	CHECK(async_readable(ctx, HANG_BOUND_S * 1000), "no asynchronous event within %d s",
	      HANG_BOUND_S);
	CHECK(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
	printf("event: %s\n", ibv_event_type_str(ev.event_type));
	return ev;
}

static void wait_completions(struct ibv_cq *cq, int count)
{
	struct ibv_wc wc;
	int seen = 0;
	while (seen < count) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n == 0)
			continue;
		CHECK(wc.status == IBV_WC_SUCCESS, "completion %s", ibv_wc_status_str(wc.status));
		seen++;
	}
}

static int srq_limit_and_last_wqe(void)
{
	struct setup s;
	set_up(&s);
	union ibv_gid gid;
	struct ibv_port_attr port;
	CHECK(ibv_query_gid(s.ctx, PORT, 0, &gid) == 0, "ibv_query_gid");
	CHECK(ibv_query_port(s.ctx, PORT, &port) == 0, "ibv_query_port");

	/* Through the extended call (a basic SRQ), which the extended context provides. */
	struct ibv_srq_init_attr_ex srq_init = {
		.attr = { .max_wr = SRQ_WRS, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
		.srq_type = IBV_SRQT_BASIC,
		.pd = s.pd,
	};
	struct ibv_srq *srq = ibv_create_srq_ex(s.ctx, &srq_init);
	CHECK(srq, "ibv_create_srq_ex");
	CHECK(srq_init.attr.max_wr >= SRQ_WRS, "ibv_create_srq_ex wrote back max_wr %u",
	      srq_init.attr.max_wr);
	struct ibv_qp *sender = rc_qp(&s, NULL);
	struct ibv_qp *receiver = rc_qp(&s, srq);
	connect_qp(sender, receiver->qp_num, &gid, port.active_mtu);
	connect_qp(receiver, sender->qp_num, &gid, port.active_mtu);

	for (int i = 0; i < POSTED; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)s.buf + (size_t)i * MSG, .length = MSG,
				       .lkey = s.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
		struct ibv_recv_wr *bad = NULL;
		CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "ibv_post_srq_recv");
	}
	struct ibv_srq_attr arm = { .srq_limit = LIMIT };
	CHECK(ibv_modify_srq(srq, &arm, IBV_SRQ_LIMIT) == 0, "arming the SRQ limit");
	CHECK(!async_readable(s.ctx, 0), "async_fd readable before any event");

	/* POSTED - SENDS receives are left: below the limit, so exactly one SRQ_LIMIT_REACHED. */
	for (int i = 0; i < SENDS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)s.buf + 32768, .length = MSG,
				       .lkey = s.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 100 + (uint64_t)i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *bad = NULL;
		CHECK(ibv_post_send(sender, &wr, &bad) == 0, "ibv_post_send");
	}
	wait_completions(s.cq, 2 * SENDS);

	struct ibv_async_event ev = next_event(s.ctx);
	CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED, "expected SRQ_LIMIT_REACHED");
	CHECK(ev.element.srq == srq, "the event names another SRQ");
	ibv_ack_async_event(&ev);
	printf("SRQ limit reached: verified\n");

	/* Nothing pending now: a non-blocking async_fd answers EAGAIN. */
	int flags = fcntl(s.ctx->async_fd, F_GETFL);
	CHECK(flags >= 0 && fcntl(s.ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
	errno = 0;
	CHECK(ibv_get_async_event(s.ctx, &ev) == -1 && errno == EAGAIN,
	      "non-blocking ibv_get_async_event with nothing pending");
	CHECK(fcntl(s.ctx->async_fd, F_SETFL, flags) == 0, "blocking again");
	printf("empty non-blocking async_fd: EAGAIN\n");

	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(receiver, &err, IBV_QP_STATE) == 0, "modify to ERR");
	ev = next_event(s.ctx);
	CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED, "expected QP_LAST_WQE_REACHED");
	CHECK(ev.element.qp == receiver, "the event names another QP");
	ibv_ack_async_event(&ev);
	printf("last WQE reached: verified\n");

	/* Every delivered event is acknowledged: the destroys must not block. */
	CHECK(ibv_destroy_qp(receiver) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_qp(sender) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
	CHECK(ibv_dereg_mr(s.mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_destroy_cq(s.cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_dealloc_pd(s.pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(s.ctx) == 0, "ibv_close_device");
	printf("async events: all passed\n");
	return 0;
}

static int device_fatal(void)
{
	struct setup s;
	set_up(&s);
	struct ibv_qp *qp = rc_qp(&s, NULL);
	printf("ready\n");
	fflush(stdout);
	struct ibv_async_event ev;
	/* Blocking read: the caller kills the device under us. */
	CHECK(ibv_get_async_event(s.ctx, &ev) == 0, "ibv_get_async_event");
	printf("event: %s\n", ibv_event_type_str(ev.event_type));
	CHECK(ev.event_type == IBV_EVENT_DEVICE_FATAL, "expected DEVICE_FATAL");
	ibv_ack_async_event(&ev);
	(void)qp;
	printf("device fatal: verified\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1 && strcmp(argv[1], "fatal") == 0)
		return device_fatal();
	return srq_limit_and_last_wqe();
}
