/* Registration of a 1 GiB buffer, scattered and contiguous, checked by RDMA READ of every page:
 * each 4 KiB page carries a stamp of its index at its start and end, one RC QP of the process
 * reads the whole region through another QP's responder (rxe resolves every page through the
 * registration) in 4 MiB READs, and every page's stamps are compared.
 *
 * "Scattered": before the whole buffer is registered, its 4 MiB chunks are registered and
 * deregistered one by one, odd chunks first. Natively that changes nothing; over vrdma's drop-in
 * each registration re-backs its chunk with guest RAM in that order, so the 1 GiB region ends up
 * over 256 runs of guest RAM that do not follow each other, and its registration sends 256
 * extents. The program prints how many mappings cover the region (/proc/self/maps), which the
 * dropin suite checks over vrdma. Plain rdma-core API: runs natively on rxe0 and, unchanged, over
 * vrdma. Exit status 0 = pass. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "verbs_test.h"

#define REGION (1ul << 30)
#define PAGE 4096ul
#define CHUNK (4ul << 20)
#define READ_SIZE (4ul << 20)

static uint64_t stamp(uint64_t seed, size_t page, uint64_t end)
{
	return (seed ^ (page * 0x9E3779B97F4A7C15ull)) + end;
}

static double ms_since(const struct timespec *start)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - start->tv_sec) * 1e3 + (now.tv_nsec - start->tv_nsec) / 1e6;
}

/* How many lines of /proc/self/maps overlap [start, start + len). */
static int mappings_over(const unsigned char *start, size_t len)
{
	FILE *maps = fopen("/proc/self/maps", "r");
	CHECK(maps, "/proc/self/maps");
	uintptr_t lo = (uintptr_t)start, hi = lo + len;
	unsigned long from, to;
	char line[512];
	int count = 0;
	while (fgets(line, sizeof(line), maps))
		if (sscanf(line, "%lx-%lx", &from, &to) == 2 && from < hi && to > lo)
			count++;
	fclose(maps);
	return count;
}

static void run(int scattered)
{
	const char *mode = scattered ? "scattered" : "contiguous";
	const uint64_t seed = scattered ? 0x5ca77e4edull : 0xc0471605ull;
	struct ibv_context *ctx = open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq, "ibv_create_cq");
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *reader = ibv_create_qp(pd, &init);
	struct ibv_qp *owner = ibv_create_qp(pd, &init);
	CHECK(reader && owner, "ibv_create_qp");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, PORT, 0, &gid) == 0, "ibv_query_gid");
	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, PORT, &port) == 0, "ibv_query_port");
	connect_qp(reader, owner->qp_num, &gid, port.active_mtu);
	connect_qp(owner, reader->qp_num, &gid, port.active_mtu);

	unsigned char *region = NULL;
	CHECK(posix_memalign((void **)&region, PAGE, REGION) == 0, "posix_memalign of 1 GiB");
	for (size_t p = 0; p < REGION / PAGE; p++) {
		uint64_t first = stamp(seed, p, 0), last = stamp(seed, p, 1);
		memcpy(region + p * PAGE, &first, 8);
		memcpy(region + p * PAGE + PAGE - 8, &last, 8);
	}
	if (scattered) {
		for (size_t pass = 1; pass <= 2; pass++)
			for (size_t c = pass % 2; c < REGION / CHUNK; c += 2) {
				struct ibv_mr *piece = ibv_reg_mr(pd, region + c * CHUNK, CHUNK,
								  IBV_ACCESS_LOCAL_WRITE);
				CHECK(piece, "registering chunk %zu", c);
				CHECK(ibv_dereg_mr(piece) == 0, "deregistering chunk %zu", c);
			}
		printf("scattered: region in %d mappings\n", mappings_over(region, REGION));
	}
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	struct ibv_mr *mr = ibv_reg_mr(pd, region, REGION,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "registering 1 GiB (%s)", mode);
	/* Informational only: no test judges a duration. */
	printf("1 GiB %s: registered in %.0f ms\n", mode, ms_since(&start));

	unsigned char *local = NULL;
	CHECK(posix_memalign((void **)&local, PAGE, READ_SIZE) == 0, "posix_memalign");
	struct ibv_mr *local_mr = ibv_reg_mr(pd, local, READ_SIZE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(local_mr, "ibv_reg_mr of the READ target");
	size_t verified = 0;
	for (size_t offset = 0; offset < REGION; offset += READ_SIZE) {
		/* Stale bytes of the previous READ would carry other page indices: no need to clear. */
		struct ibv_sge sge = {
			.addr = (uintptr_t)local, .length = READ_SIZE, .lkey = local_mr->lkey,
		};
		struct ibv_send_wr wr = {
			.wr_id = offset,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IBV_WR_RDMA_READ,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)region + offset, .rkey = mr->rkey },
		};
		struct ibv_send_wr *bad = NULL;
		errno = ibv_post_send(reader, &wr, &bad);
		CHECK(errno == 0, "posting the READ at %zu", offset);
		struct ibv_wc wc = wait_status(cq, IBV_WC_SUCCESS);
		CHECK(wc.wr_id == offset && wc.opcode == IBV_WC_RDMA_READ, "READ completion");
		for (size_t p = 0; p < READ_SIZE / PAGE; p++) {
			size_t page = (offset + p * PAGE) / PAGE;
			uint64_t first, last;
			memcpy(&first, local + p * PAGE, 8);
			memcpy(&last, local + p * PAGE + PAGE - 8, 8);
			CHECK(first == stamp(seed, page, 0) && last == stamp(seed, page, 1),
			      "%s: page %zu read back %#" PRIx64 "/%#" PRIx64 ", expected %#" PRIx64
			      "/%#" PRIx64, mode, page, first, last, stamp(seed, page, 0),
			      stamp(seed, page, 1));
			verified++;
		}
	}
	printf("1 GiB %s: %zu pages verified by RDMA READ\n", mode, verified);

	CHECK(ibv_dereg_mr(local_mr) == 0 && ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_destroy_qp(reader) == 0 && ibv_destroy_qp(owner) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(local);
	free(region);
}

int main(void)
{
	run(1);
	run(0);
	printf("mr_1gib: all passed\n");
	return 0;
}
