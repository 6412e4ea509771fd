/* Stand-in for rdma-core's libmlx5.so.1 next to vrdma's drop-in libibverbs.so.1.
 *
 * Debian's perftest links libmlx5 directly; the real one needs libibverbs' private ABI, which the
 * drop-in does not have, so the binaries would not load. perftest calls these functions only
 * for Mellanox devices, which vrdma0 is not; each fails as its manual page documents. The
 * symbol versions are in libmlx5.map. */
#include <errno.h>
#include <stddef.h>

int mlx5dv_query_device(void *ctx, void *attrs) { (void)ctx; (void)attrs; return EOPNOTSUPP; }
void *mlx5dv_open_device(void *device, void *attr) { (void)device; (void)attr; errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_create_qp(void *ctx, void *qp_attr, void *mlx5_qp_attr) { (void)ctx; (void)qp_attr; (void)mlx5_qp_attr; errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_qp_ex_from_ibv_qp_ex(void *qp) { (void)qp; errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_create_mkey(void *attr) { (void)attr; errno = EOPNOTSUPP; return NULL; }
int mlx5dv_destroy_mkey(void *mkey) { (void)mkey; return EOPNOTSUPP; }
int mlx5dv_devx_general_cmd(void *ctx, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)ctx; (void)in; (void)inlen; (void)out; (void)outlen; return EOPNOTSUPP; }
int mlx5dv_crypto_login(void *ctx, void *attr) { (void)ctx; (void)attr; return EOPNOTSUPP; }
void *mlx5dv_dek_create(void *ctx, void *attr) { (void)ctx; (void)attr; errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dek_destroy(void *dek) { (void)dek; return EOPNOTSUPP; }
void *mlx5dv_reg_dmabuf_mr(void *pd, unsigned long offset, size_t length, unsigned long iova, int fd, int access, int mlx5_access)
{ (void)pd; (void)offset; (void)length; (void)iova; (void)fd; (void)access; (void)mlx5_access; errno = EOPNOTSUPP; return NULL; }
