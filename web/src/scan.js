// The QR decoder (`qr` package), a bundle of its own: the page loads it
// only to scan with the camera, and only where the browser has no
// BarcodeDetector for QR codes.
export { decodeQR } from 'qr/decode.js';
