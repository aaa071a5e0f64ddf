// Grazing plans: a paddock cut into N equal-width strips, each a fence with its own active window
// (properties active_from / active_to, ISO 8601; CONTRACT.md). Pure functions, no DOM.

const M_PER_DEG_LAT = 110540;
const M_PER_DEG_LON = 111320;

// Cut a Polygon's outer ring into n strips of equal width across its longer side (east-west extent vs
// north-south, measured in metres). Each strip is the ring clipped to a band (Sutherland-Hodgman); a band
// that misses the paddock is left out. Returns GeoJSON Polygon geometries, west→east or north→south.
export function splitIntoStrips(geometry, n) {
  if (!geometry || geometry.type !== 'Polygon') throw new Error('only a single polygon can be split into strips');
  const ring = geometry.coordinates[0].slice(0, -1);
  const lat0 = ring.reduce((s, p) => s + p[1], 0) / ring.length;
  const kx = M_PER_DEG_LON * Math.cos(lat0 * Math.PI / 180);
  const xy = ring.map(([lon, lat]) => [lon * kx, lat * M_PER_DEG_LAT]);
  const xs = xy.map((p) => p[0]), ys = xy.map((p) => p[1]);
  const alongX = Math.max(...xs) - Math.min(...xs) >= Math.max(...ys) - Math.min(...ys);
  const axis = alongX ? 0 : 1;
  // north→south when cutting along y reads naturally on a map: strip 1 at the top
  const lo = alongX ? Math.min(...xs) : -Math.max(...ys);
  const hi = alongX ? Math.max(...xs) : -Math.min(...ys);
  const coord = (p) => (axis === 0 ? p[0] : -p[1]);
  const width = (hi - lo) / n;
  const strips = [];
  for (let i = 0; i < n; i++) {
    const a = lo + i * width, b = i === n - 1 ? hi : lo + (i + 1) * width;
    let part = clip(xy, (p) => coord(p) >= a, (p, q) => cut(p, q, a, coord));
    part = clip(part, (p) => coord(p) <= b, (p, q) => cut(p, q, b, coord));
    part = dedupe(part);
    if (part.length < 3) continue;
    const lonlat = part.map(([x, y]) => [round(x / kx), round(y / M_PER_DEG_LAT)]);
    lonlat.push(lonlat[0].slice());
    strips.push({ type: 'Polygon', coordinates: [lonlat] });
  }
  return strips;
}

function clip(poly, inside, intersect) {
  const out = [];
  for (let i = 0; i < poly.length; i++) {
    const cur = poly[i], prev = poly[(i + poly.length - 1) % poly.length];
    const cIn = inside(cur), pIn = inside(prev);
    if (cIn) { if (!pIn) out.push(intersect(prev, cur)); out.push(cur); } else if (pIn) out.push(intersect(prev, cur));
  }
  return out;
}
function cut(p, q, at, coord) {
  const t = (at - coord(p)) / (coord(q) - coord(p));
  return [p[0] + (q[0] - p[0]) * t, p[1] + (q[1] - p[1]) * t];
}
function dedupe(pts) {
  const out = [];
  for (const p of pts) {
    const last = out[out.length - 1];
    if (!last || Math.hypot(p[0] - last[0], p[1] - last[1]) > 0.01) out.push(p);
  }
  if (out.length > 1 && Math.hypot(out[0][0] - out.at(-1)[0], out[0][1] - out.at(-1)[1]) <= 0.01) out.pop();
  return out;
}
const round = (v) => Math.round(v * 1e7) / 1e7;

// The plan's fences: strip i is active from start + i·hours for `hours`.
export function planFeatures(parent, n, start, hours) {
  const props = parent.properties || {};
  const base = props.name || 'Paddock';
  return splitIntoStrips(parent.geometry, n).map((geometry, i, all) => {
    const from = new Date(start.getTime() + i * hours * 3600e3);
    const to = new Date(from.getTime() + hours * 3600e3);
    const properties = { name: `${base} · strip ${i + 1}/${all.length}`, active_from: from.toISOString(),
      active_to: to.toISOString(), plan_of: String(parent.id), strip: i + 1 };
    if (props.warn_m) properties.warn_m = props.warn_m;
    return { type: 'Feature', geometry, properties };
  });
}

// Where a fence's window stands at `now`: 'always' (no window), 'active', 'upcoming' or 'past'.
export function windowState(props, now = Date.now()) {
  const from = props && props.active_from ? Date.parse(props.active_from) : NaN;
  const to = props && props.active_to ? Date.parse(props.active_to) : NaN;
  if (isNaN(from) && isNaN(to)) return 'always';
  if (!isNaN(to) && now >= to) return 'past';
  if (!isNaN(from) && now < from) return 'upcoming';
  return 'active';
}
