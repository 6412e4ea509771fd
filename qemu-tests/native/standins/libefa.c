/* Stand-in for rdma-core's libefa.so.1 next to vrdma's drop-in libibverbs.so.1 (see
 * libmlx5.c): perftest calls these only for EFA devices. Versions in libefa.map. */
#include <errno.h>
#include <stddef.h>

int efadv_query_device(void *ibvctx, void *attr, unsigned int inlen) { (void)ibvctx; (void)attr; (void)inlen; return EOPNOTSUPP; }
void *efadv_create_qp_ex(void *ibvctx, void *attr_ex, void *efa_attr, unsigned int inlen)
{ (void)ibvctx; (void)attr_ex; (void)efa_attr; (void)inlen; errno = EOPNOTSUPP; return NULL; }
