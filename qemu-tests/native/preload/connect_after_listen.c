/*
 * LD_PRELOAD helper for perftest -R clients (vrdma-vm's rdmacm-utils suite): rdma_connect
 * waits until an rdma_cm id listens on the destination port of this host, then connects.
 *
 * perftest 25.01's -R server answers its client's handshake and only then creates, binds and
 * listens the id for the data connections, while the client connects at once: a race the
 * server usually wins, and a client that loses it gets REJECTED (no listener) and crashes in
 * its own retry (fixed upstream in perftest 26.04). Peers run on one host here, so the client
 * can see the listener appear in `rdma resource show cm_id` instead. The wait has no limit of
 * its own: the harness bounds the whole run.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whether `rdma -j resource show cm_id` lists an id in LISTEN whose source port is `port`. */
static int listening(unsigned port)
{
	FILE *out = popen("rdma -j resource show cm_id 2>/dev/null", "r");
	char suffix[16], *text = NULL, *at;
	size_t len = 0, cap = 0, n;
	int found = 0;

	if (!out)
		return 0;
	for (;;) {
		if (cap - len < 4096) {
			char *grown = realloc(text, cap + 65536);
			if (!grown)
				break;
			text = grown;
			cap += 65536;
		}
		n = fread(text + len, 1, cap - len - 1, out);
		if (n == 0)
			break;
		len += n;
	}
	pclose(out);
	if (!text)
		return 0;
	text[len] = '\0';
	snprintf(suffix, sizeof(suffix), ":%u\"", port);
	/* Each id is one JSON object: its state comes before its source address. */
	for (at = strstr(text, "\"state\":\"LISTEN\""); at && !found;
	     at = strstr(at + 1, "\"state\":\"LISTEN\"")) {
		char *src = strstr(at, "\"src-addr\":\"");
		char *end = src ? strchr(src + 12, '"') : NULL;
		char *next = strchr(at, '}');

		if (src && end && next && src < next &&
		    (size_t)(end + 1 - src) >= strlen(suffix) &&
		    strncmp(end + 1 - strlen(suffix), suffix, strlen(suffix)) == 0)
			found = 1;
	}
	free(text);
	return found;
}

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	static int (*next)(struct rdma_cm_id *, struct rdma_conn_param *);
	struct sockaddr *dst = rdma_get_peer_addr(id);
	unsigned port = ntohs(dst->sa_family == AF_INET6 ?
				      ((struct sockaddr_in6 *)dst)->sin6_port :
				      ((struct sockaddr_in *)dst)->sin_port);

	if (!next)
		next = dlvsym(RTLD_NEXT, "rdma_connect", "RDMACM_1.0");
	if (!next)
		return -1;
	while (!listening(port))
		usleep(10000);
	return next(id, conn_param);
}
