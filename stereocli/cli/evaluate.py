"""`stereo eval`: maps against ground truth."""
from __future__ import annotations

import click

from ..errors import StereoError
from .app import cli
from .common import print_metrics


@cli.command("eval")
@click.argument("estimate", type=click.Path())
@click.argument("ground_truth", type=click.Path())
@click.option("--mask", type=click.Path(dir_okay=False),
              help="Image whose non-zero pixels are evaluated (e.g. Middlebury non-occluded masks).")
@click.option("--max-disparity", type=float, help="Ignore ground truth above this disparity.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per map (and the total) on stdout.")
@click.option("--error-map", type=click.Path(),
              help="Write KITTI-style error pictures: a .png file for two files, a folder (NAME.png each) for "
                   "two folders. Blue to red = error below to far above D1's 3 px / 5 %; magenta = no "
                   "estimate; black = no ground truth.")
@click.option("--confidence", type=click.Path(),
              help="Confidence map(s) of the estimate (from match --confidence): a file, or a folder for two "
                   "folders. Also prints the sparsification figures: bad-2 of the 50 % most confident pixels, "
                   "of all, and the area under the bad-2 sparsification curve (and the best possible area).")
def eval_cmd(estimate, ground_truth, mask, max_disparity, as_json, error_map, confidence):
    """Compare disparity maps with ground truth (Middlebury/KITTI metrics).

    ESTIMATE and GROUND_TRUTH are two files, or two folders whose files pair by name
    (stem). Any format `match` writes is read, plus Middlebury PFM (inf = unknown) and
    KITTI 16-bit PNG (value/256, 0 = unknown) ground truth.

    bad-t: share of ground-truth pixels whose estimate is off by more than t px or
    missing; "(est)": the same over estimated pixels only; D1: error > 3 px and > 5 %.
    The folder total is over all pixels of all maps.

    \b
    Examples:
      stereo eval disp.pfm sample_data/disp.pfm
      stereo eval disp.pfm sample_data/disp.pfm --error-map errors.png
      stereo eval results/ gt/ --json --error-map error_maps/
      stereo eval disp.pfm sample_data/disp.pfm --confidence conf.pfm
    """
    from pathlib import Path

    import numpy as np

    from .. import io, metrics

    def maps_by_stem(folder):
        return {p.stem: p for p in sorted(folder.iterdir()) if p.suffix.lower() in io.DISPARITY_FORMATS}

    est_p, gt_p = Path(estimate), Path(ground_truth)
    if est_p.is_dir() != gt_p.is_dir():
        raise StereoError("give two files or two folders")
    if est_p.is_dir():
        gts = maps_by_stem(gt_p)
        pairs = [(p, gts[p.stem]) for p in sorted(est_p.iterdir()) if p.stem in gts
                 and p.suffix.lower() in io.DISPARITY_FORMATS]
        if not pairs:
            raise StereoError(f"no file of {est_p} has a ground-truth file of the same name in {gt_p}")
    else:
        pairs = [(est_p, gt_p)]
    if error_map:
        if est_p.is_dir():
            io.make_folder(error_map)
        else:
            io.check_preview_path(error_map)
    conf_files = {}
    if confidence:
        conf_p = Path(confidence)
        if conf_p.is_dir() != est_p.is_dir():
            raise StereoError("--confidence is a file for two files, a folder for two folders")
        if conf_p.is_dir():
            conf_files = maps_by_stem(conf_p)
            missing = [e.stem for e, _ in pairs if e.stem not in conf_files]
            if missing:
                raise StereoError(f"{conf_p} has no confidence map named {missing[0]} (of {len(missing)} missing); "
                                  f"give the folder that match/batch --confidence wrote")
        else:
            conf_files = {est_p.stem: conf_p}
    ranked = []
    mask_img = io.read_image(mask) != 0 if mask else None
    if mask_img is not None and mask_img.ndim == 3:
        mask_img = mask_img.any(axis=2)
    total = None
    for e, g in pairs:
        est, gt = io.read_disparity(e), io.read_disparity(g)
        if mask_img is not None and mask_img.shape != gt.shape:
            raise StereoError(f"--mask is {mask_img.shape[1]}x{mask_img.shape[0]} but {g} is "
                              f"{gt.shape[1]}x{gt.shape[0]}")
        c = metrics.counts(est, gt, mask=mask_img, max_disparity=max_disparity)
        if error_map:
            target = Path(error_map) / f"{e.stem}.png" if est_p.is_dir() else Path(error_map)
            io.write_image(target, metrics.error_image(est, gt))
        total = metrics.add(total, c)
        m = metrics.summarize(c)
        if confidence:
            ranked.append(metrics.confidence_ranking(io.read_disparity(conf_files[e.stem]), est, gt, mask_img,
                                                     max_disparity))
            m["sparsification"] = metrics.sparsification(*ranked[-1])
        print_metrics(str(e), m, as_json)
    if len(pairs) > 1:
        m = metrics.summarize(total)
        if confidence:
            m["sparsification"] = metrics.sparsification(np.concatenate([r[0] for r in ranked]),
                                                         np.concatenate([r[1] for r in ranked]))
        print_metrics("total", m, as_json)
