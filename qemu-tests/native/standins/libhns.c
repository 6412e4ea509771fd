/* Stand-in for rdma-core's libhns.so.1 next to vrdma's drop-in libibverbs.so.1 (see
 * libmlx5.c): perftest calls this only for HiSilicon devices. Version in libhns.map. */
#include <errno.h>
#include <stddef.h>

void *hnsdv_create_qp(void *context, void *qp_attr, void *hns_attr) { (void)context; (void)qp_attr; (void)hns_attr; errno = EOPNOTSUPP; return NULL; }
