"""`stereo rectify`: raw camera pair -> rectified pair."""
from __future__ import annotations

import click

from .app import cli


@cli.command("rectify")
@click.argument("left")
@click.argument("right")
@click.option("--calib", required=True, type=click.Path(dir_okay=False),
              help="Stereo calibration: OpenCV YAML/XML (K1, D1, K2, D2, R, T from stereoCalibrate), KITTI "
                   "calib_cam_to_cam.txt (cameras 2 and 3) or Middlebury calib.txt.")
@click.option("-o", "--output", nargs=2, required=True, metavar="LEFT_OUT RIGHT_OUT",
              help="The two rectified images (.png, .tif, .jpg, ...).")
def rectify_cmd(left, right, calib, output):
    """Rectify a raw stereo pair: undistort both images and turn them so that matching
    points lie on the same row, with a common principal point. Prints the rectified
    camera (focal length in pixels, baseline) for depth.

    \b
    Examples:
      stereo rectify raw_l.png raw_r.png --calib stereo.yml -o left.png right.png
      stereo rectify image_02/0000.png image_03/0000.png --calib calib_cam_to_cam.txt -o l.png r.png
      stereo match raw_l.png raw_r.png --rectify --calib stereo.yml -o disp.pfm -n 128 --depth z.pfm
    """
    from .. import io, rectify
    outs = [io.check_image_path(o) for o in output]
    stereo_calib = rectify.read_stereo_calibration(calib)
    left_r, right_r, cam = rectify.rectify(io.read_image(left), io.read_image(right), stereo_calib)
    for path, img in zip(outs, (left_r, right_r)):
        io.write_image(path, img)
    click.echo(f"stereo: rectified camera: focal {cam.focal:.3f} px, baseline {cam.baseline:.6g}, principal "
               f"point ({cam.cx:.2f}, {cam.cy:.2f}); depth = focal * baseline / disparity "
               f"(stereo match ... --focal {cam.focal:.3f} --baseline {cam.baseline:.6g})", err=True)
