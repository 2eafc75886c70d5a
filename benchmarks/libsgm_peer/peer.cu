// libSGM as a peer on the machine at hand: the figures of issue 13's table (libSGM
// e4c669b, census 9x7 + SGM + WTA + LR check, subpixel on, best of 100 warm runs), measured
// beside benchmarks/gpu.py on the same GPU instead of read from the table, which was
// measured on an H100. Built against libSGM's sources by build.sh; gpu.py --libsgm-peer
// runs it for every configuration on the same resized cones pair.
//
//   peer LEFT.raw RIGHT.raw WIDTH HEIGHT DISPARITIES PATHS [ITERATIONS [CENSUS]]
//
// LEFT.raw and RIGHT.raw hold WIDTH x HEIGHT 8-bit pixels, row by row; CENSUS is 0 for
// libSGM's CENSUS_9x7 (the 63-bit census that stereocli computes too, the default) or 1
// for its SYMMETRIC_CENSUS_9x7 (31 bits). Prints one JSON line: the best "kernel" time
// (images on the device, the map left there: libSGM's EXECUTE_INOUT_CUDA2CUDA) and the
// best host-to-host time (EXECUTE_INOUT_HOST2HOST: upload, every kernel, download of
// the 16-bit map), each the best of ITERATIONS after one warm run. Each run is timed
// two ways: CUDA events recorded around execute() (the kernels, without the wait for
// the host to see them end) and the wall clock around execute() and
// cudaDeviceSynchronize(), as libSGM's own stereosgm_benchmark does; kernel_ms and
// host_to_host_ms are the smaller of the two, so that libSGM is not charged for the
// timing. Also a checksum of the map, so that runs can be compared.
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>
#include <libsgm.h>

static std::vector<uint8_t> read_raw(const char* path, size_t n)
{
	std::vector<uint8_t> v(n);
	FILE* f = std::fopen(path, "rb");
	if (!f || std::fread(v.data(), 1, n, f) != n) {
		std::fprintf(stderr, "peer: cannot read %zu bytes from %s\n", n, path);
		std::exit(2);
	}
	std::fclose(f);
	return v;
}

static void check(cudaError_t e, const char* what)
{
	if (e != cudaSuccess) {
		std::fprintf(stderr, "peer: %s: %s\n", what, cudaGetErrorString(e));
		std::exit(1);
	}
}

struct Best {
	double events = 1e30, wall = 1e30;
	double least() const { return events < wall ? events : wall; }
};

template <class F>
static Best best_ms(F run, int iterations)
{
	run();  // warm
	check(cudaDeviceSynchronize(), "warm run");
	cudaEvent_t e0, e1;
	check(cudaEventCreate(&e0), "cudaEventCreate");
	check(cudaEventCreate(&e1), "cudaEventCreate");
	Best best;
	for (int i = 0; i < iterations; i++) {
		const auto t1 = std::chrono::steady_clock::now();
		cudaEventRecord(e0);
		run();
		cudaEventRecord(e1);
		cudaDeviceSynchronize();
		const auto t2 = std::chrono::steady_clock::now();
		float ev = 0;
		cudaEventElapsedTime(&ev, e0, e1);
		const double wall = std::chrono::duration<double, std::milli>(t2 - t1).count();
		best.events = ev < best.events ? ev : best.events;
		best.wall = wall < best.wall ? wall : best.wall;
	}
	check(cudaGetLastError(), "timed runs");
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	return best;
}

int main(int argc, char* argv[])
{
	if (argc < 7) {
		std::fprintf(stderr, "usage: peer LEFT.raw RIGHT.raw WIDTH HEIGHT DISPARITIES PATHS [ITERATIONS [CENSUS]]\n");
		return 2;
	}
	const int w = std::atoi(argv[3]), h = std::atoi(argv[4]);
	const int ndisp = std::atoi(argv[5]), paths = std::atoi(argv[6]);
	const int iterations = argc > 7 ? std::atoi(argv[7]) : 100;
	const bool symmetric = argc > 8 && std::atoi(argv[8]) == 1;
	const size_t n = size_t(w) * h;
	const std::vector<uint8_t> left = read_raw(argv[1], n), right = read_raw(argv[2], n);
	std::vector<uint16_t> disp(n);

	// P1 10, P2 120, uniqueness 0.95, subpixel, min disparity 0, LR max difference 1
	const sgm::StereoSGM::Parameters param(10, 120, 0.95f, true,
		paths == 8 ? sgm::PathType::SCAN_8PATH : sgm::PathType::SCAN_4PATH, 0, 1,
		symmetric ? sgm::CensusType::SYMMETRIC_CENSUS_9x7 : sgm::CensusType::CENSUS_9x7);

	uint8_t *dl, *dr;
	uint16_t* dd;
	check(cudaMalloc(&dl, n), "cudaMalloc");
	check(cudaMalloc(&dr, n), "cudaMalloc");
	check(cudaMalloc(&dd, n * 2), "cudaMalloc");
	check(cudaMemcpy(dl, left.data(), n, cudaMemcpyHostToDevice), "upload");
	check(cudaMemcpy(dr, right.data(), n, cudaMemcpyHostToDevice), "upload");

	Best kernel, host;
	{
		sgm::StereoSGM sgm(w, h, ndisp, 8, 16, sgm::EXECUTE_INOUT_CUDA2CUDA, param);
		kernel = best_ms([&] { sgm.execute(dl, dr, dd); }, iterations);
	}
	{
		sgm::StereoSGM sgm(w, h, ndisp, 8, 16, sgm::EXECUTE_INOUT_HOST2HOST, param);
		host = best_ms([&] { sgm.execute(left.data(), right.data(), disp.data()); }, iterations);
	}
	uint64_t sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += disp[i];
	cudaDeviceProp prop;
	check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
	std::printf("{\"gpu\": \"%s\", \"width\": %d, \"height\": %d, \"num_disparities\": %d, \"paths\": %d, "
		"\"census\": \"%s\", \"iterations\": %d, \"kernel_ms\": %.4f, \"kernel_events_ms\": %.4f, "
		"\"kernel_wall_ms\": %.4f, \"host_to_host_ms\": %.4f, \"host_to_host_events_ms\": %.4f, "
		"\"host_to_host_wall_ms\": %.4f, \"map_sum\": %llu}\n",
		prop.name, w, h, ndisp, paths, symmetric ? "SYMMETRIC_CENSUS_9x7" : "CENSUS_9x7", iterations,
		kernel.least(), kernel.events, kernel.wall, host.least(), host.events, host.wall, (unsigned long long)sum);
	return 0;
}
