import re, sys
sys.path.insert(0, '.')
import numpy as np
from stereocli.backends.cuda import CudaBackend
from stereocli.backends import cuda_kernels as K
bk = CudaBackend()
C = np.zeros((8, 8, 128), np.uint8); G = np.zeros((8, 8), np.uint8)
bk.download(bk.sgm(bk.upload(C), bk.upload(G), 40, 480, True, 8))
for sig, ptx in K.sgm_lines_kernel.inspect_asm().items():
    print('PTX lines', len(ptx.splitlines()), 'ld.local', ptx.count('ld.local'), 'st.local', ptx.count('st.local'), 'shfl', ptx.count('shfl'), 'ld.global', ptx.count('ld.global'))
try:
    for sig, n in K.sgm_lines_kernel.get_regs_per_thread().items(): print('regs', n)
except Exception as e: print('regs?', e)
