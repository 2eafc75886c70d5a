import cProfile, pstats, time, io as sio
import numpy as np
from stereocli import config, io, pipeline
from stereocli.backends import get_backend
bk = get_backend("cuda")
L = io.read_image(".data/teddy/left.png"); R = io.read_image(".data/teddy/right.png")
import cv2
L = cv2.cvtColor(L, cv2.COLOR_BGR2GRAY); R = cv2.cvtColor(R, cv2.COLOR_BGR2GRAY)
p = config.load("default", None, {"num_disparities": 64})
for _ in range(5): pipeline.run(L, R, p, bk)
t = time.perf_counter()
for _ in range(100): r = pipeline.run(L, R, p, bk)
print("per match ms", (time.perf_counter() - t) * 10, r.timings)
pr = cProfile.Profile(); pr.enable()
for _ in range(100): pipeline.run(L, R, p, bk)
pr.disable()
s = sio.StringIO(); st = pstats.Stats(pr, stream=s); st.sort_stats("tottime").print_stats(30); st.sort_stats("cumulative").print_stats(45)
print(s.getvalue())
